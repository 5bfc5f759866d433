"""`python -m vit_jax.predict`: the `vit-predict` command, `vit_jax.cli.predict`."""

from vit_jax.cli import predict

if __name__ == '__main__':
  predict.run_cli()
