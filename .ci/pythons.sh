# shellcheck shell=bash
# python_of X.Y: a runnable interpreter of Python X.Y: `pythonX.Y` on PATH, else pyenv's newest
# X.Y.* (its shims answer for versions it has without selecting them).
python_of() {
  if "python$1" -c '' 2>/dev/null; then
    echo "python$1"
    return
  fi
  local found
  found="$(find "$(pyenv root 2>/dev/null)/versions" -maxdepth 1 -name "$1.*" 2>/dev/null \
    | sort -V | tail -n 1)"
  if [[ -z "$found" || ! -x "$found/bin/python$1" ]]; then
    echo "error: no Python $1 (neither python$1 on PATH nor pyenv's $1.*): install it" >&2
    return 1
  fi
  echo "$found/bin/python$1"
}
