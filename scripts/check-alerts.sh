#!/bin/bash
# The Prometheus config and alert rules are valid, and each alert fires when
# it should, and not otherwise
# (promtool, from Debian's `prometheus` package: installed when missing).
set -euo pipefail
cd "$(dirname "$0")/../deploy/prometheus"
if ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# The compose profile's config: its syntax only (the admin token's file it
# names exists only inside the container), then the rules it loads.
promtool check config --syntax-only prometheus.yml
promtool check rules alerts.yml
promtool test rules alerts.test.yml
