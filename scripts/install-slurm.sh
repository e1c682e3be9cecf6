#!/usr/bin/env bash
# Slurm and munge from Debian's packages, for the lab's Slurm cluster (raysweep.lab.slurm; the Slurm
# tests and `make demo-slurm`). Idempotent and quick when they are installed already: nothing is done when
# slurmctld, slurmd, sbatch and munged are on PATH. As root on Debian/Ubuntu it installs them with apt-get,
# with every daemon kept from starting (the lab starts its own, per host, and stops them by pid): a
# policy-rc.d that refuses every start is put in place for the install when the machine has none, and any
# daemon the packages' scripts started anyway is stopped by the pid it wrote. Otherwise it says what to
# install and leaves the decision to the user (the Slurm tests are then skipped with a warning).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if have slurmctld && have slurmd && have sbatch && have munged; then
    echo "install-slurm: slurm and munge present: $(/usr/sbin/slurmctld -V 2>/dev/null || echo slurmctld)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    cat >&2 <<'MSG'
install-slurm: Slurm (slurmctld, slurmd, the client commands) and munge are not installed, and this script
installs them only as root with apt-get.
  Debian/Ubuntu: sudo apt-get install slurmctld slurmd slurm-client munge
The Slurm tests (tests/test_slurm.py, marker `lab`) are skipped without them.
MSG
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
POLICY=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$POLICY" ]; then   # keep the packages' init scripts from starting daemons during the install
    printf '#!/bin/sh\n# raysweep install-slurm: no daemon starts during the install\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
    made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$POLICY"' EXIT
echo "install-slurm: installing slurmctld slurmd slurm-client munge with apt-get"
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null

# systemd (where it runs) may still have started a unit: stop each by the pid it wrote, never by name
for pidfile in /run/munge/munged.pid /run/slurmctld.pid /run/slurmd.pid /var/run/slurmctld.pid \
               /var/run/slurmd.pid; do
    if [ -s "$pidfile" ] && pid=$(cat "$pidfile") && kill -0 "$pid" 2>/dev/null; then
        echo "install-slurm: stopping the daemon the package started (pid $pid, $pidfile)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
done
echo "install-slurm: done: $(/usr/sbin/slurmctld -V)"
