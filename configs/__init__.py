"""Experiment configs, selected as `--config=configs/vit.py:b16,cifar10` (ml_collections files).

They ship with the package (`pip install .` installs them as the package `configs`), so the
same flag works from any working directory: `configs/NAME.py` is this package's file unless
the working directory has its own `configs/NAME.py`. A config of one's own is any other path;
it may build on these (`from configs import common, models`).
"""

import os

from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_file_flag

DIR = os.path.dirname(os.path.abspath(__file__))


def resolve(path: str) -> str:
  """`FILE[:ARG]` with FILE this package's when it is `configs/NAME.py` and not found as given."""
  file, colon, arg = path.partition(':')
  folder, name = os.path.split(os.path.normpath(file))
  if not os.path.exists(file) and folder == 'configs' and os.path.isfile(os.path.join(DIR, name)):
    file = os.path.join(DIR, name)
  return file + colon + arg


class _Parser(config_file_flag.ConfigFileFlagParser):
  """ml_collections' config file parser, with `resolve` applied to the path."""

  def parse(self, path):
    return super().parse(resolve(path))


def define_config_flag(
  name: str, help_string: str, lock_config: bool = True, flag_values=flags.FLAGS
) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name, ...)` whose `configs/NAME.py` is found anywhere.

  `--NAME.key=value` overrides work as usual; `get_config_filename` gives the path as typed.
  """
  holder = config_flags.DEFINE_config_file(
    name, None, help_string, flag_values=flag_values, lock_config=lock_config
  )
  flag_values[name].parser = _Parser(name=name, lock_config=lock_config)
  return holder
