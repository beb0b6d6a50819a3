# kit_python.sh - sourced by the Python kit's e2e tests (tests/e2e_kit.sh, tests/e2e_kit_verify.sh).
#   kit_python    sets KIT_PY to a Python 3 that imports numpy and h5py and prints which one: $DSV4_PYTHON if set,
#                 else python3 on PATH, else /usr/bin/python3 (where Debian's python3-numpy and python3-h5py
#                 install; a pyenv or venv python3 first on PATH may have neither). Returns 1, saying so, when none
#                 has them: scripts/deps.sh installs them, so a missing one is a failure, not a skip.
kit_python() {
    local py
    for py in ${DSV4_PYTHON:-} python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -c 'import numpy, h5py' 2>/dev/null; then
            KIT_PY=$(command -v "$py")
            echo "python for the kit: $KIT_PY ($("$KIT_PY" -c 'import sys, numpy, h5py
print("Python", sys.version.split()[0] + ", numpy", numpy.__version__ + ", h5py", h5py.__version__)'))"
            return 0
        fi
        echo "python for the kit: $py lacks numpy or h5py, not used"
    done
    echo "FAILED: no python3 with numpy and h5py (tried ${DSV4_PYTHON:+$DSV4_PYTHON, }python3, /usr/bin/python3);" \
         "scripts/deps.sh installs python3-numpy and python3-h5py"
    return 1
}
