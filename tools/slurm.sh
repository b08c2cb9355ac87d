#!/usr/bin/env bash
# A one-node SLURM cluster for the tests: `tools/slurm.sh start DIR` installs slurm-wlm and munge if missing, writes
# DIR/slurm.conf from tools/slurm/slurm.conf.in and starts munged, slurmctld and slurmd; `tools/slurm.sh stop DIR`
# stops them and removes DIR. Clients find the cluster through SLURM_CONF=DIR/slurm.conf.
set -euo pipefail
cmd=$1; dir=$2
here=$(cd "$(dirname "$0")" && pwd)
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo  # GitHub's runners: not root, sudo without a password
case $cmd in
start)
  command -v slurmctld >/dev/null && command -v munged >/dev/null || {
    $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
  mkdir -p "$dir"/{state,spool,munge}
  chmod 755 "$dir"  # munged runs as user munge: it must reach its socket and log under DIR (mktemp makes DIR 700)
  $sudo chown munge:munge "$dir/munge"
  $sudo test -s /etc/munge/munge.key || { $sudo dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    $sudo chown munge:munge /etc/munge/munge.key; $sudo chmod 400 /etc/munge/munge.key; }
  $sudo runuser -u munge -- munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
  port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  sed -e "s|@HOST@|$(hostname -s)|g" -e "s|@DIR@|$dir|g" -e "s|@CTLD_PORT@|$(port)|" -e "s|@SLURMD_PORT@|$(port)|" \
      "$here/slurm/slurm.conf.in" > "$dir/slurm.conf"
  echo "AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5" >> "$dir/slurm.conf"
  sed -i '/^AuthInfo=cred_expire=5$/d' "$dir/slurm.conf"
  export SLURM_CONF="$dir/slurm.conf"
  $sudo slurmctld -f "$SLURM_CONF"
  $sudo slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do sinfo -h -o %t 2>/dev/null | grep -qx idle && exit 0; sleep 0.2; done
  echo "SLURM did not come up:"; tail -20 "$dir"/*.log; exit 1 ;;
stop)
  for p in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$p" ] && $sudo kill "$(cat "$p")" 2>/dev/null || true
  done
  sleep 1
  $sudo pkill -f "slurmd -f $dir/slurm.conf" 2>/dev/null || true; $sudo pkill -f "slurmctld -f $dir/slurm.conf" 2>/dev/null || true
  $sudo pkill -f "munged --socket=$dir/munge" 2>/dev/null || true
  $sudo rm -rf "$dir" ;;
esac
