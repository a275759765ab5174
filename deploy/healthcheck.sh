#!/bin/bash
# The flashsale image's HEALTHCHECK: GET /healthz on the process's own port,
# by bash's /dev/tcp (the image has no curl). `serve` listens on LISTEN_ADDR
# (default 127.0.0.1:8080); `worker` answers /healthz on METRICS_ADDR, and
# without one has no port: then the process running is all there is to say.
# FLASHSALE_HEALTH_ADDR overrides both (an address given as an argument
# rather than in the environment).
addr=${FLASHSALE_HEALTH_ADDR:-}
if [ -z "$addr" ]; then
  if tr '\0' ' ' </proc/1/cmdline | grep -qw worker; then
    addr=${METRICS_ADDR:-}
  else
    addr=${LISTEN_ADDR:-127.0.0.1:8080}
  fi
fi
[ -n "$addr" ] || exit 0
port=${addr##*:}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 3 status <&3 || exit 1
[[ $status == "HTTP/1.1 200"* ]]
