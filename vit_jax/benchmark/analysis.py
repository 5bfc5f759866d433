"""What XLA says of a program: its FLOPs as lowered, and of the compiled program its memory,
memory traffic and whether it calls cuDNN's fused attention."""

from typing import Any


def _xla_bytes(compiled: Any) -> int | None:
  """arguments + outputs - aliased (donated) + temporaries, from the compiled program."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend implements it
    return None
  if m is None:
    return None
  return int(
    m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  )


def _compiled_cost(compiled: Any) -> tuple[float | None, int | None]:
  """(XLA's bytes accessed, temporary bytes) of the compiled program; None where the backend
  does not say."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # a list in older jax
    accessed = float(cost['bytes accessed']) if cost and 'bytes accessed' in cost else None
  except Exception:  # not every backend implements it
    accessed = None
  try:
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:
    temp = None
  return accessed, temp


def compiled_facts(compiled: Any) -> dict[str, Any]:
  """XLA's memory and memory traffic for the program, and whether it calls cuDNN's fused
  attention kernel (`jax.nn.dot_product_attention` falls back to XLA where cuDNN does not
  apply)."""
  accessed, temp = _compiled_cost(compiled)
  return {
    'xla_memory_bytes': _xla_bytes(compiled),
    'bytes_accessed': accessed,
    'temp_bytes': temp,
    'cudnn_attention': 'cudnn$fmha' in compiled.as_text(),
  }


def flops(lowered: Any) -> float:
  """XLA's FLOP count of the program as lowered; NaN where the backend does not analyse
  lowered programs (GPUs under jax 0.11). A compiled GPU program is no substitute: its
  matmuls are cuBLAS custom calls, which the analysis counts as 0 FLOPs."""
  cost = lowered.cost_analysis()
  return float('nan') if cost is None else float(cost['flops'])
