"""`python -m vit_jax.benchmark`: the `vit-benchmark` command, `vit_jax.cli.benchmark`."""

from vit_jax.cli import benchmark

if __name__ == '__main__':
  benchmark.run_cli()
