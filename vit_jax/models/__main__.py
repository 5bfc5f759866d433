"""`python -m vit_jax.models`: the `vit-models` command, `vit_jax.cli.models`."""

from vit_jax.cli import models

if __name__ == '__main__':
  models.run_cli()
