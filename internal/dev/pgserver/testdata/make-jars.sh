#!/bin/sh
# Writes the test jars of embedded_internal_test.go, laid out as
# io.zonky.test.postgres's: a zip holding a tar.xz of the installation.
#   installation.jar  bin/postgres (0755), lib/libpq.so -> libpq.so.5.15, share/
#   path-leaves.jar   a member named ../evil
#   link-leaves.jar   lib/x -> ../../etc/passwd
set -eu
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

jar() { # jar NAME DIR TAR-ARGS...: the tar.xz of DIR's members as NAME
  name=$1 dir=$2
  shift 2
  (cd "$dir" && tar --owner=0 --group=0 --mtime=2026-01-01 -cf - "$@" | xz -9 >"$work/postgres-linux-x86_64.txz")
  rm -f "$name"
  (cd "$work" && TZ=UTC zip -X -q "$OLDPWD/$name" postgres-linux-x86_64.txz)
}

mkdir -p "$work/i/bin" "$work/i/lib" "$work/i/share"
printf '#!/bin/sh\n' >"$work/i/bin/postgres" && chmod 755 "$work/i/bin/postgres"
printf 'elf' >"$work/i/lib/libpq.so.5.15" && chmod 644 "$work/i/lib/libpq.so.5.15"
ln -s libpq.so.5.15 "$work/i/lib/libpq.so"
printf '#' >"$work/i/share/postgresql.conf.sample" && chmod 644 "$work/i/share/postgresql.conf.sample"
jar installation.jar "$work/i" bin lib share

mkdir -p "$work/p/d" && printf 'x' >"$work/p/evil"
jar path-leaves.jar "$work/p/d" -P ../evil

mkdir -p "$work/l/lib" && ln -s ../../etc/passwd "$work/l/lib/x"
jar link-leaves.jar "$work/l" lib/x
