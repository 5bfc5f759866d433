# shellcheck shell=bash
# Shared by the launch scripts, which source it (tpu_pod.sh's workers too): the help text, the
# options (--dry-run, --mesh, --sharding), the lock that fits an interpreter and its jax
# version, and dry-runnable commands.

usage() {  # the calling script's header comment, without its #SBATCH lines
  awk 'NR > 1 && !/^#/ { exit } NR > 1 && !/^#SBATCH/ { sub(/^# ?/, ""); print }' "$0"
}

launch_options() {  # a launcher's own options, before its other arguments (into the array ARGS):
  # -h/--help prints the usage and exits; --dry-run sets DRY_RUN=1; --mesh SPEC (or --mesh=SPEC)
  # sets MESH, --sharding RULE sets SHARDING. One of them after the other arguments is an error:
  # it would reach vit_jax.main as an unknown flag.
  DRY_RUN="${DRY_RUN:-0}" MESH='' SHARDING=''
  local value
  while (($#)); do
    case "$1" in
      -h | --help)
        usage
        exit 0
        ;;
      --dry-run) DRY_RUN=1 ;;
      --mesh | --sharding)  # as --mesh=SPEC
        set -- "$1=${2:-}" "${@:3}"
        continue
        ;;
      --mesh=* | --sharding=*)
        value="${1#*=}"
        if [[ -z "$value" || "$value" == -* ]]; then
          options_error "${1%%=*} needs a value, e.g. --mesh data:-1,model:4 or --sharding tp"
        fi
        if [[ "$1" == --mesh=* ]]; then MESH="$value"; else SHARDING="$value"; fi
        ;;
      *) break ;;
    esac
    shift
  done
  # shellcheck disable=SC2034  # read by the script that calls this
  ARGS=("$@")
  for value in "$@"; do
    case "$value" in
      --dry-run | --mesh | --mesh=* | --sharding | --sharding=*)
        options_error "${value%%=*} is an option of this script: put it before the other arguments"
        ;;
    esac
  done
}

options_error() {  # the usage, then one line naming the problem; exit status 2
  usage >&2
  echo "error: $1" >&2
  exit 2
}

mesh_flags() {  # MESH and SHARDING as the flags ${1}mesh= and ${1}sharding= (those given), into
  # the array MESH_FLAGS: $1 is --config. for vit_jax.main, -- for vit_jax.benchmark
  MESH_FLAGS=()
  if [[ -n "$MESH" ]]; then
    MESH_FLAGS+=("${1}mesh=$MESH")
  fi
  if [[ -n "$SHARDING" ]]; then
    MESH_FLAGS+=("${1}sharding=$SHARDING")
  fi
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
