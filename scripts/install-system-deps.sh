#!/bin/sh
# Installs the system programs the test suite needs when they are missing:
# PostgreSQL server binaries (initdb, pg_ctl, postgres) from Debian's packages.
set -eu

have_postgres() {
    command -v pg_ctl >/dev/null 2>&1 && return 0
    ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1
}

if have_postgres; then
    echo "== PostgreSQL server binaries found"
    exit 0
fi

echo "== installing Debian's postgresql (server binaries for the tests)"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
have_postgres || { echo "PostgreSQL server binaries still missing after install" >&2; exit 1; }
