"""Python logging's levels, changed for a block: libraries that warn at each call of what is
harmless to us (onnx_ir's untyped shapes, onnxruntime's quantizer, orbax through absl)."""

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def errors_only(name: str | None = None) -> Iterator[None]:
  """Within the block, the logger `name` (None: the root logger) passes errors alone; its
  level is restored after."""
  logger = logging.getLogger(name)
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)
