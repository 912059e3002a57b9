#!/bin/sh
# verify-kernel-signature.sh ARCHIVE SIGNATURE KEYRING
# kernel.org signs the UNCOMPRESSED tarball (linux-X.tar.sign covers linux-X.tar, not .tar.xz), so the
# archive is decompressed into gpgv. gpgv trusts exactly the keys in KEYRING and nothing else.
# Prints one line; exit 0 only for a good signature by a key in KEYRING.
set -u
archive=$1 sig=$2 keyring=$3
case "$archive" in
  *.xz) dec="xz -dc" ;; *.gz) dec="gzip -dc" ;; *) dec="cat" ;;
esac
out=$($dec "$archive" | gpgv --status-fd 1 --keyring "$keyring" "$sig" - 2>&1)
rc=$?
good=$(printf '%s\n' "$out" | sed -n 's/^\[GNUPG:\] VALIDSIG \([0-9A-F]*\) .*/\1/p' | head -n1)
if [ "$rc" -eq 0 ] && [ -n "$good" ]; then
  echo "good signature of $(basename "$archive") by $good"
  exit 0
fi
why=$(printf '%s\n' "$out" | grep -m1 -E 'BAD signature|No public key|no signature found|not a detached signature|can.t open' || true)
echo "$(basename "$archive"): signature $(basename "$sig") does not verify against $keyring: ${why:-gpgv exited $rc}"
exit 1
