"""`python -m vit_jax.main`: the `vit-train` command, `vit_jax.cli.train`."""

from vit_jax.cli import train

if __name__ == '__main__':
  train.run_cli()
