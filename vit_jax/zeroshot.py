"""`python -m vit_jax.zeroshot`: the `vit-zeroshot` command, `vit_jax.cli.zeroshot`."""

from vit_jax.cli import zeroshot

if __name__ == '__main__':
  zeroshot.run_cli()
