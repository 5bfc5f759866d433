"""`python -m vit_jax.embed`: the `vit-embed` command, `vit_jax.cli.embed`."""

from vit_jax.cli import embed

if __name__ == '__main__':
  embed.run_cli()
