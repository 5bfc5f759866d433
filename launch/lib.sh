# shellcheck shell=bash
# Shared by launch/tpu_pod.sh and launch/slurm_gpu.sh, which source it from the repository
# root: the help text, the pinned jax version, and dry-runnable commands.

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

pinned_jax_version() {  # the jax==X.Y.Z pin of requirements.txt
  local version
  version="$(sed -n 's/^jax==//p' requirements.txt)"
  if [[ -z "$version" ]]; then
    echo "error: requirements.txt pins no jax version (expected a line jax==X.Y.Z)" >&2
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
