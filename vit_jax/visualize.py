"""`python -m vit_jax.visualize`: the `vit-visualize` command, `vit_jax.cli.visualize`."""

from vit_jax.cli import visualize

if __name__ == '__main__':
  visualize.run_cli()
