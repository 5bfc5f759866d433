"""`python -m vit_jax.reproduce`: the `vit-reproduce` command, `vit_jax.cli.reproduce`."""

from vit_jax.cli import reproduce

if __name__ == '__main__':
  reproduce.run_cli()
