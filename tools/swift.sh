#!/usr/bin/env bash
# An OpenStack Swift with its S3 API, on 127.0.0.1, for the tests of object storage: `tools/swift.sh start DIR`
# installs Debian's swift packages if missing, makes one-replica rings and devices under DIR and starts the account,
# container, object and proxy servers (s3api and tempauth: key test:tester, secret testing; key test:owner, its secret
# new at each start, in DIR/secret); it prints the endpoint (also in DIR/endpoint). `tools/swift.sh stop DIR` stops them
# and removes DIR. `proxy-stop DIR` and `proxy-start DIR` stop and start the proxy alone, on its port: the store goes
# away and comes back, its objects kept.
set -euo pipefail
cmd=$1; dir=$2
here=$(cd "$(dirname "$0")" && pwd)
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
start_server() {  # in a session of its own: `stop` ends it and its children
  setsid swift-$1-server "$dir/$1-server.conf" --verbose >> "$dir/run/$1.log" 2>&1 < /dev/null &
  echo $! > "$dir/run/$1.pid"
}
wait_for_proxy() {
  for _ in $(seq 300); do
    curl -fs "$(cat "$dir/endpoint")/healthcheck" >/dev/null 2>&1 && { cat "$dir/endpoint"; return 0; }
    sleep 0.1
  done
  echo "Swift did not come up:"; tail -n 20 "$dir"/run/*.log; exit 1
}
case $cmd in
start)
  command -v swift-proxy-server >/dev/null && command -v swift-object-server >/dev/null && command -v memcached >/dev/null || {
    $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      swift swift-proxy swift-account swift-container swift-object memcached >/dev/null; }
  $sudo test -f /etc/swift/swift.conf || { $sudo mkdir -p /etc/swift
    printf '[swift-hash]\nswift_hash_path_suffix = ddp_safe_tests\n[storage-policy:0]\nname = Policy-0\ndefault = yes\n' | $sudo tee /etc/swift/swift.conf >/dev/null; }
  mkdir -p "$dir/srv/d1" "$dir/run"
  port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  python3 -c 'import secrets; print(secrets.token_hex(16))' > "$dir/secret"  # a credential that a test looks for in files
  declare -A ports=([account]=$(port) [container]=$(port) [object]=$(port) [proxy]=$(port) [memcached]=$(port))
  setsid memcached -l 127.0.0.1 -p "${ports[memcached]}" -U 0 -u "$(id -un)" > "$dir/run/memcached.log" 2>&1 < /dev/null &  # tempauth keeps its tokens there
  echo $! > "$dir/run/memcached.pid"
  for s in account container object; do
    (cd "$dir" && swift-ring-builder $s.builder create 6 1 1 >/dev/null \
      && swift-ring-builder $s.builder add r1z1-127.0.0.1:${ports[$s]}/d1 100 >/dev/null \
      && swift-ring-builder $s.builder rebalance >/dev/null)
  done
  for s in account container object proxy; do  # proxy last: its answer says the others are up
    sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|${ports[$s]}|g" -e "s|@USER@|$(id -un)|g" -e "s|@MEMCACHED@|127.0.0.1:${ports[memcached]}|g" -e "s|@SECRET@|$(cat "$dir/secret")|g" "$here/swift/$s-server.conf.in" > "$dir/$s-server.conf"
    start_server $s
  done
  echo "http://127.0.0.1:${ports[proxy]}" > "$dir/endpoint"
  wait_for_proxy ;;
proxy-start)  # a proxy already running is kept: a second would share its port
  kill -0 "$(cat "$dir/run/proxy.pid")" 2>/dev/null || start_server proxy
  wait_for_proxy ;;
proxy-stop)
  kill -- -"$(cat "$dir/run/proxy.pid")"
  while kill -0 "$(cat "$dir/run/proxy.pid")" 2>/dev/null; do sleep 0.05; done ;;
stop)
  for p in "$dir"/run/*.pid; do [ -f "$p" ] && kill -- -"$(cat "$p")" 2>/dev/null || true; done
  sleep 0.5
  for p in "$dir"/run/*.pid; do [ -f "$p" ] && kill -9 -- -"$(cat "$p")" 2>/dev/null || true; done
  rm -rf "$dir" ;;
esac
