#!/usr/bin/env bash
# e2e_kit.sh - the Python kit python/dsv4dump on its own (CPU, no torch):
#   its unit tests (python/tests: the writer's layout, padding and refusals, the digest rule, `check` on a consistent
#   dump and on 31 broken ones, each named by its one message, `tokens`);
#   installed with the system's pip from a copy of python/ (no build isolation, no index: what works where no
#   package index is reachable), the installed `dsv4-dump check` passes every committed golden dump with --complete;
#   and the same from the source tree with PYTHONPATH=python.
# The Python is tests/support/kit_python.sh's (numpy + h5py; /usr/bin/python3 when python3 on PATH lacks them).
set -u -o pipefail
ROOT="${DSV4_SOURCE_DIR:?}"
# shellcheck source=tests/support/kit_python.sh
source "$ROOT/tests/support/kit_python.sh"
kit_python || { echo "e2e_kit: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-kit-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
goldens=()
for f in "$ROOT"/golden/*/*.h5; do goldens+=("$f"); done
[ ${#goldens[@]} -ge 6 ] || { echo "FAILED: fewer than 6 committed golden dumps under $ROOT/golden"; fail=1; }

unit() { (cd "$ROOT/python" && PYTHONPATH=.:tests PYTHONDONTWRITEBYTECODE=1 "$KIT_PY" -m unittest discover -s tests -v); }
step unit
cp -r "$ROOT/python" "$T/src"
if "$KIT_PY" -m pip --version >/dev/null 2>&1; then
    step env PIP_ROOT_USER_ACTION=ignore "$KIT_PY" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$T/site" "$T/src"
    installed_check() { PYTHONPATH="$T/site" "$T/site/bin/dsv4-dump" check --complete "$@"; }
    step installed_check "${goldens[@]}"
    where() { PYTHONPATH="$T/site" "$KIT_PY" -c 'import dsv4dump, sys; print(dsv4dump.__file__); sys.exit(not dsv4dump.__file__.startswith(sys.argv[1]))' "$T/site"; }
    step where
else
    echo "FAILED: $KIT_PY has no pip (scripts/deps.sh installs python3-pip): the install from the repository is not tested"
    fail=1
fi
source_check() { PYTHONPATH="$ROOT/python" "$KIT_PY" -m dsv4dump check --complete "$@"; }
step source_check "${goldens[@]}"
[ $fail -eq 0 ] && echo "e2e_kit: 1 passed, 0 failed" || echo "e2e_kit: 0 passed, 1 failed"
exit $fail
