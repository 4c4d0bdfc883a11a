#!/usr/bin/env bash
# Lint gate (run by .ci/run before the tests): ruff check, ruff format --check, and clang-format on every
# tracked C++/CUDA file. Tools: the pinned `lint` extra (pip install -e ".[test,lint]").
# Usage: bash scripts/lint.sh          (exit 1 on any finding, with the command that fixes it)
set -uo pipefail
cd "$(dirname "$0")/.."
# The project's venv (as .ci/run makes it) if it has the tools, else whatever is on PATH.
tool() { if [[ -x ".venv/bin/$1" ]]; then echo ".venv/bin/$1"; else command -v "$1" || echo "$1"; fi; }
ruff="$(tool ruff)"
clang_format="$(tool clang-format)"
for t in "$ruff" "$clang_format"; do
  command -v "$t" >/dev/null || { echo "lint: $t not found; install the pinned tools: pip install -e \".[lint]\"" >&2; exit 2; }
done

# The C++/CUDA sources: every tracked one except the upstream tutorial's verbatim copy.
# Tracked and untracked-but-not-ignored: a new kernel is checked before its first `git add`.
mapfile -t cxx < <(git ls-files --cached --others --exclude-standard '*.cuh' '*.h' '*.cu' '*.cpp' '*.cc' | grep -v '^test/tutorial_verbatim/' | sort -u)

failed=()
echo "== ruff check"
"$ruff" check . || failed+=("ruff check")
echo "== ruff format --check"
"$ruff" format --check . || failed+=("ruff format")
echo "== clang-format --dry-run -Werror (${#cxx[@]} files)"
"$clang_format" --dry-run -Werror "${cxx[@]}" || failed+=("clang-format")

if ((${#failed[@]})); then
  echo
  echo "lint FAILED: ${failed[*]}. Fix with:"
  echo "    $ruff check --fix . && $ruff format . && git ls-files --cached --others --exclude-standard '*.cuh' '*.h' '*.cu' '*.cpp' '*.cc' | grep -v '^test/tutorial_verbatim/' | xargs $clang_format -i"
  echo "or, where github.com is reachable (pre-commit fetches its hooks from there):"
  echo "    $(tool pre-commit) run --all-files"
  echo "(ruff check --fix leaves findings it cannot fix safely: fix those by hand.)"
  exit 1
fi
echo "lint passed"
