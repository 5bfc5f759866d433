"""`python -m vit_jax.convert`: the `vit-convert` command, `vit_jax.cli.convert`."""

from vit_jax.cli import convert

if __name__ == '__main__':
  convert.run_cli()
