"""notebooks/walkthrough.ipynb, executed end to end in a fresh kernel of this Python, as a user
runs it from notebooks/: an error in any cell fails the test, and the notebook asserts its own
numbers (the B/16 count, call-time against load-time resize, Hugging Face and timm logits)."""

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # a notebook kernel

NOTEBOOK = Path(__file__).resolve().parent.parent / 'notebooks' / 'walkthrough.ipynb'
CELL_TIMEOUT_S = 300  # the longest cell, the first training (500 steps): 24 s on 2 CPU cores


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
  return [cell for cell in nb.cells if cell.cell_type == 'code']


def _kernel_env(tmp: Path) -> dict[str, str]:
  """This process's environment with the machine as a user's kernel sees it: without the 8
  simulated CPU devices of conftest.py, with matplotlib's inline backend (ipykernel's default,
  which a set MPLBACKEND overrides), and with temporary files under `tmp`. WALKTHROUGH_STEPS=short
  (documented in the notebook) cuts its two trainings to a few steps: nothing it asserts
  depends on the count."""
  env = dict(os.environ, TMPDIR=str(tmp), WALKTHROUGH_STEPS='short')
  flags = env.get('XLA_FLAGS', '').split()
  env['XLA_FLAGS'] = ' '.join(f for f in flags if 'xla_force_host_platform_device_count' not in f)
  env.pop('MPLBACKEND', None)
  return env


def test_the_notebook_is_saved_without_outputs():
  """Outputs (figures as base64, numbers of one machine) stay out of the repository."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  executed = [i for i, c in enumerate(nb.cells) if c.get('outputs') or c.get('execution_count')]
  assert not executed, (
    f'{NOTEBOOK.name}: cells {executed} (from 0) hold outputs; clear them before committing '
    '(Jupyter: Edit > Clear Outputs of All Cells).'
  )


def test_the_notebook_runs_end_to_end(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nb.cells.append(nbformat.v4.new_code_cell('import sys\nprint(sys.executable, end="")'))
  client = NotebookClient(
    nb,
    timeout=CELL_TIMEOUT_S,
    kernel_name='python3',  # jupyter_client starts it with this process's sys.executable
    resources={'metadata': {'path': str(NOTEBOOK.parent)}},
  )
  client.execute(env=_kernel_env(tmp_path))  # raises CellExecutionError naming the cell

  cells = _code_cells(nb)
  errors = [o for cell in cells for o in cell.outputs if o.output_type == 'error']
  assert not errors, errors
  assert cells[-1].outputs[0].text == sys.executable
  for cell in cells:  # every figure is drawn inline
    shown = len(re.findall(r'plt\.show\(\)', cell.source))
    figures = [o for o in cell.outputs if 'image/png' in o.get('data', {})]
    assert len(figures) == shown, cell.source
  assert sum(len(re.findall(r'plt\.show\(\)', cell.source)) for cell in cells) == 5
