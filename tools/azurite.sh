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
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # --disableTelemetry: it would reach out otherwise
  setsid "$bin" --blobHost 127.0.0.1 --blobPort "$port" --location "$dir" --disableTelemetry --skipApiVersionCheck --silent \
    > "$dir/azurite.log" 2>&1 < /dev/null &
  echo $! > "$dir/azurite.pid"
  # the emulator's well-known development account (https://learn.microsoft.com/azure/storage/common/storage-use-azurite)
  key='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
  echo "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=$key;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;" > "$dir/connection_string"
  for _ in $(seq 300); do
    (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && { cat "$dir/connection_string"; exit 0; }
    sleep 0.1
  done
  echo "azurite did not come up:"; tail -n 20 "$dir/azurite.log"; exit 1 ;;
stop)
  [ -f "$dir/azurite.pid" ] && kill -- -"$(cat "$dir/azurite.pid")" 2>/dev/null || true
  rm -rf "$dir" ;;
esac
