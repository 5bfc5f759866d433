# shellcheck shell=bash
# Shared by launch/tpu_pod.sh and launch/slurm_gpu.sh, which source it from the repository
# root (tpu_pod.sh's workers too): the help text, the lock that fits an interpreter and its jax
# version, and dry-runnable commands.

usage() {  # the calling script's header comment, without its #SBATCH lines
  awk 'NR > 1 && !/^#/ { exit } NR > 1 && !/^#SBATCH/ { sub(/^# ?/, ""); print }' "$0"
}

dry_run_flag() {  # -h/--help: prints the usage, exits; --dry-run: sets DRY_RUN=1, returns 0
  DRY_RUN="${DRY_RUN:-0}"
  case "${1:-}" in
    -h | --help)
      usage
      exit 0
      ;;
    --dry-run)
      DRY_RUN=1
      return 0
      ;;
  esac
  return 1
}

lock_end() {  # the end whose lock fits interpreter $1: oldest (3.11), newest (3.12, 3.13)
  local version  # $2: the variable that names the interpreter, for the error
  version="$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || version=''
  case "$version" in
    3.11) printf oldest ;;
    3.12 | 3.13) printf newest ;;
    *)
      echo "error: $1 is ${version:+Python }${version:-not found}: the project runs on 3.11, 3.12 or 3.13; name one with $2=" >&2
      exit 2
      ;;
  esac
}

pinned_jax_version() {  # the jax==X.Y.Z pin of requirements/$1.txt, end $1's lock
  local version
  version="$(sed -n 's/^jax==//p' "requirements/$1.txt" 2>/dev/null)"
  if [[ -z "$version" ]]; then
    echo "error: requirements/$1.txt pins no jax version (expected a line jax==X.Y.Z)" >&2
    exit 2
  fi
  printf '%s' "$version"
}

quoted() {  # words joined by spaces, each quoted only if it needs it
  local word out=""
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
      out+=" $word"
    else
      out+=" ${word@Q}"
    fi
  done
  printf '%s' "${out# }"
}

run() {  # prints the command; runs it unless DRY_RUN=1
  echo "+ $(quoted "$@")"
  if [[ "${DRY_RUN:-0}" != 1 ]]; then
    "$@"
  fi
}
