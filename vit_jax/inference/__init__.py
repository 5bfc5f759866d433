"""The inference layer: any checkpoint, export directory or registered model as one `Model`
with its preprocessing, tokenizer and class names (`load`), and what the commands, the
embedder and notebooks build on it: zero-shot classification and retrieval
(`inference/zeroshot.py`), embeddings in resumable shards (`inference/embed.py`), attention
maps (`inference/attention.py`), one checkpoint described (`inference/describe.py`).
"""

from vit_jax.inference.loader import holds, load
from vit_jax.inference.model import Model

__all__ = ['Model', 'holds', 'load']
