#!/usr/bin/env bash
# Azure's own storage emulator, azurite (its blob service), on 127.0.0.1, for the tests of checkpoints in Azure Blob
# storage through adlfs: `tools/azurite.sh start DIR` installs azurite from npm if missing (under ~/.cache), starts it
# with its data in DIR and prints the connection string (also in DIR/connection_string); `tools/azurite.sh stop DIR`
# stops it and removes DIR.
set -euo pipefail
cmd=$1; dir=$2
prefix=${AZURITE_PREFIX:-$HOME/.cache/ddp_safe_azurite}
bin=$prefix/node_modules/.bin/azurite-blob
case $cmd in
start)
  [ -x "$bin" ] || npm install --silent --no-fund --no-audit --prefix "$prefix" azurite@3.35 >/dev/null
  mkdir -p "$dir"
  # the emulator's well-known development account (https://learn.microsoft.com/azure/storage/common/storage-use-azurite)
  key='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
  # two tries on fresh ports: between choosing a free port and azurite listening on it, another process (the site's
  # build runs distributed examples meanwhile) may take it; a try gives up when azurite exits, or after 120 s
  for try in 1 2; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # --disableTelemetry: it would reach out otherwise
    setsid "$bin" --blobHost 127.0.0.1 --blobPort "$port" --location "$dir" --disableTelemetry --skipApiVersionCheck --silent \
      > "$dir/azurite.log" 2>&1 < /dev/null &
    pid=$!; echo $pid > "$dir/azurite.pid"
    echo "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=$key;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;" > "$dir/connection_string"
    for _ in $(seq 1200); do
      # up when what answers on the port names itself azurite (not another process that took the port)
      (exec 3<>/dev/tcp/127.0.0.1/$port && printf 'GET /devstoreaccount1 HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3) 2>/dev/null \
        | grep -q '^Server: Azurite' && { cat "$dir/connection_string"; exit 0; }
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 $pid 2>/dev/null; then echo "azurite (try $try) not listening on 127.0.0.1:$port after 120 s; stopped"; kill -- -$pid
    else wait $pid && rc=0 || rc=$?; echo "azurite (try $try) exited with status $rc before listening on 127.0.0.1:$port"; fi
    echo "its log:"; tail -n 20 "$dir/azurite.log"
  done
  exit 1 ;;
stop)
  [ -f "$dir/azurite.pid" ] && kill -- -"$(cat "$dir/azurite.pid")" 2>/dev/null || true
  rm -rf "$dir" ;;
esac
