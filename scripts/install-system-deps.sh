#!/bin/sh
# Installs the system programs stitchfleet needs when they are missing:
# - PostgreSQL server binaries (initdb, pg_ctl, postgres) for the test suite;
# - C and C++ compilers: the cpu backend compiles clusters with `cc`, the native TF bridge op
#   and Horovod's build use `c++`.
set -eu

have_postgres() {
    command -v pg_ctl >/dev/null 2>&1 && return 0
    ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1
}

missing=""
have_postgres || missing="$missing postgresql"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v c++ >/dev/null 2>&1 || missing="$missing g++"

if [ -z "$missing" ]; then
    echo "== PostgreSQL server binaries and C/C++ compilers found"
    exit 0
fi

echo "== installing Debian's$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
# shellcheck disable=SC2086  # the package list is meant to split
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
have_postgres || { echo "PostgreSQL server binaries still missing after install" >&2; exit 1; }
command -v c++ >/dev/null 2>&1 || { echo "c++ still missing after install" >&2; exit 1; }
