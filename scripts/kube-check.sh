#!/usr/bin/env bash
# deploy/kubernetes/ checked, then run for real under podman as far as
# podman runs Kubernetes manifests:
#
#   a. validation (no cluster needed): every manifest against the Kubernetes
#      API's schemas by kubernetes-validate (PyPI, pinned below, bundled
#      schemas: works offline) in strict mode (an unknown field is an
#      error; so is a warning, e.g. an apiVersion it has no schema for), for
#      each of KUBE_VERSIONS; the kustomizations list every manifest, and
#      exist; every variable the manifests give a flashsale container is a
#      setting of docs/configuration.md (a misspelt one is silently ignored
#      by the service, and no schema catches it); the Secrets hold
#      placeholders only (CHANGE-ME-...).
#   b. podman kube play (podman installed when missing, as compose-test.sh
#      does; KUBE_CHECK_PODMAN=0 skips this part): the image
#      localhost/flashsale:latest built as compose-test.sh builds it (the
#      Dockerfile's runtime-prebuilt around the release binary, on the local
#      Debian base); `serve --dry-run` / `worker --dry-run` with each
#      container's environment as the manifests make it (with the Secret's
#      placeholders `serve` must refuse to start); the dev/ Redis and
#      MariaDB (scripts/container-images.sh's stand-ins for the public
#      images), then the ConfigMap, the API (2 replicas) and the workers (2
#      replicas), on a podman network of this run's own (its DNS answers
#      pod names: the Services' names are the dev pods' own); both API pods
#      ready on /readyz; a sale created and opened through the admin API,
#      an order with a buyer's JWT (202) through the other API pod, its row
#      in tb_order `confirmed`, the service signed in to MariaDB as the
#      Secret's DATABASE_URL says; both workers in the sale's consumer group
#      under their pod names (CONSUMER_NAME from the downward API); the
#      non-root user, the read-only root file system and an empty /tmp; an
#      API pod and a worker pod stopped by SIGTERM, timed, exiting 0 within
#      their grace; then `podman kube down`, and nothing of the run left
#      (pods, containers, secrets, volumes, network).
#
# Nothing is published on the host: requests reach the API by `podman exec`
# (bash's /dev/tcp, as the image's health check does), and the stores by
# `podman exec` of their own clients. The host's Redis (6379), MariaDB
# (3306) and whatever holds 8080 are never touched.
#
# What podman 4.3 (Debian bookworm's) makes of the manifests, found by
# running them. The played copies differ from the files in three points
# only, each for a podman limitation:
#   - Secret: played, 4.3 stores it as YAML and then cannot read it
#     ("secret ... is not valid JSON"); this check creates each Secret as a
#     podman secret in the JSON its secretKeyRef reads, with this run's
#     random values for the placeholders, and plays the rest.
#   - ports: 4.3 publishes every containerPort on all the host's addresses
#     at the same number when hostPort is unset (it would take the host's
#     8080 and collide with its 6379/3306; later podman publishes only
#     hostPort): the played copies have no `ports`.
#   - the dev stores' images: the stand-ins (no registry here), as
#     deploy/test/compose.test.yaml does for compose.yaml. The stand-in
#     MariaDB ignores MARIADB_USER/MARIADB_PASSWORD/MARIADB_DATABASE and
#     /docker-entrypoint-initdb.d: this check makes the account as the
#     official image does from them, and runs the init ConfigMap's SQL.
# Run as written: Deployments (replicas honoured: pods <name>-pod-0..N-1),
# Pods, ConfigMaps (envFrom; as a volume: a podman volume named after the
# ConfigMap, which kube down keeps and this check removes), env from the
# downward API (metadata.name) and from secrets, emptyDir (a podman volume
# named after the VOLUME, one for every pod using that name: the dev pods'
# are named apart), securityContext runAsUser/runAsGroup,
# readOnlyRootFilesystem, capabilities drop ALL and allowPrivilegeEscalation
# (no-new-privileges), resources (memory and CPU limits; memory requests as
# a reservation), args.
# Validated only (podman ignores them, silently): Service,
# PodDisruptionBudget, Deployment strategy and minReadySeconds,
# readinessProbe, the preStop hook (the API stops in under a second, not
# after its 10 s sleep), terminationGracePeriodSeconds (podman's stop
# timeout stays 10 s: the SIGTERM step below passes the manifest's grace
# itself), runAsNonRoot (a root image runs as root under it),
# seccompProfile (podman's default profile applies), topologySpreadConstraints,
# CPU requests, enableServiceLinks, automountServiceAccountToken.
# livenessProbe becomes a podman health check with restart on failure, as
# `curl -f http://localhost:0/healthz` (a named port read as 0, and no curl
# in the image): nothing runs podman's health checks on a machine without
# systemd, and this check runs none, so it never fires; on Kubernetes the
# kubelet probes.
#
# Environment: KUBE_VERSIONS (default "1.29.0 1.37.0": the schemas checked
# against), KUBE_CHECK_PODMAN=0 (validation only), FLASHSALE_BIN (a release
# binary; without it, this tree's: cargo build --release --locked, nothing
# to do when up to date). Every wait is bounded; everything the run starts
# is removed on exit, whatever happens (about 20 s with the images cached
# and the validator installed; a first run installs the validator, ~30 s).
set -euo pipefail
FS_ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$FS_ROOT"

KDIR=${KUBE_CHECK_DIR:-deploy/kubernetes}   # another folder: to try the check on a changed copy
KUBE_VERSIONS=${KUBE_VERSIONS:-1.29.0 1.37.0}
# The validator and its dependencies, each pinned (resolved on 2026-12-07).
VALIDATOR=kubernetes-validate==1.37.0
VALIDATOR_DEPS=(attrs==26.1.0 importlib_resources==7.1.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 packaging==26.4 PyYAML==6.0.4
  referencing==0.37.0 rpds-py==2026.9.1 typing_extensions==4.16.0)
VENV=$FS_ROOT/target/kube-check-venv   # target/ is not tracked
T0=$(date +%s)
step() { echo "== [$(($(date +%s) - T0))s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---------------------------------------------------------------- a. validate
step "validator: $VALIDATOR in $VENV"
STAMP="$VALIDATOR ${VALIDATOR_DEPS[*]}"
if [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/pip" install --quiet --disable-pip-version-check "$VALIDATOR" "${VALIDATOR_DEPS[@]}"
  echo "$STAMP" >"$VENV/.pins"
fi
PY=$VENV/bin/python

mapfile -t MANIFESTS < <(find "$KDIR" -name '*.yaml' ! -name kustomization.yaml | sort)
[ ${#MANIFESTS[@]} -gt 0 ] || fail "no manifests under $KDIR"
for v in $KUBE_VERSIONS; do
  out=$("$VENV/bin/kubernetes-validate" --strict -k "$v" "${MANIFESTS[@]}" 2>&1) && rc=0 || rc=$?
  bad=$(grep -v '^INFO ' <<<"$out" || true)
  if [ "$rc" -ne 0 ] || [ -n "$bad" ]; then
    echo "$out" >&2
    fail "kubernetes-validate --strict -k $v (exit $rc)"
  fi
  step "Kubernetes $v, strict: $(grep -c ' passed for resource ' <<<"$out") resources in ${#MANIFESTS[@]} files passed"
done

# The kustomizations, the settings' names, the placeholders.
"$PY" - "$KDIR" "${MANIFESTS[@]}" <<'PY'
import os, re, sys, yaml
kdir, manifests = sys.argv[1], sys.argv[2:]
errors = []
listed = set()
for root, _, files in os.walk(kdir):
    if "kustomization.yaml" not in files:
        continue
    k = yaml.safe_load(open(os.path.join(root, "kustomization.yaml")))
    for r in k.get("resources", []):
        path = os.path.normpath(os.path.join(root, r))
        if os.path.isdir(path):
            if not os.path.exists(os.path.join(path, "kustomization.yaml")):
                errors.append(f"{root}/kustomization.yaml: {r} has no kustomization.yaml")
        elif os.path.exists(path):
            listed.add(path)
        else:
            errors.append(f"{root}/kustomization.yaml: {r} does not exist")
for m in manifests:
    if os.path.normpath(m) not in listed:
        errors.append(f"{m} is in no kustomization.yaml")

# Every setting of docs/configuration.md's table (tests/settings.rs holds it
# to `--help`).
settings = set()
for line in open("docs/configuration.md"):
    if line.startswith("| `"):
        settings.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
assert len(settings) > 50, "the settings table was not found"
docs = {m: list(yaml.safe_load_all(open(m))) for m in manifests}
configmaps = {d["metadata"]["name"]: d for ds in docs.values() for d in ds if d["kind"] == "ConfigMap"}
checked = 0
for m, ds in docs.items():
    for d in ds:
        if d["kind"] == "Secret":
            for key, value in {**d.get("stringData", {}), **d.get("data", {})}.items():
                if "CHANGE-ME" not in value:
                    errors.append(f"{m}: Secret {d['metadata']['name']}: {key} is not a marked placeholder (CHANGE-ME-...)")
        spec = d.get("spec", {})
        pod = spec.get("template", {}).get("spec") if d["kind"] == "Deployment" else spec if d["kind"] == "Pod" else None
        for c in (pod or {}).get("containers", []):
            if not c["image"].startswith("localhost/flashsale:"):
                continue
            names = [(e["name"], "env") for e in c.get("env", [])]
            for ref in c.get("envFrom", []):
                cm = ref["configMapRef"]["name"]
                names += [(n, f"ConfigMap {cm}") for n in configmaps[cm]["data"]]
            for n, source in names:
                checked += 1
                if n not in settings:
                    errors.append(f"{m}: {d['metadata']['name']}/{c['name']}: {n} ({source}) is no setting of docs/configuration.md")
if errors:
    sys.exit("\n".join(errors))
print(f"kustomizations list all {len(manifests)} manifests; {checked} variables given to flashsale containers are all settings; the Secrets hold placeholders only")
PY
step "validation passed"

if [ "${KUBE_CHECK_PODMAN:-1}" = 0 ]; then
  step "KUBE_CHECK_PODMAN=0: podman kube play skipped"
  exit 0
fi

# ------------------------------------------------------------------- b. play
# shellcheck source=scripts/podman.sh
. "$FS_ROOT/scripts/podman.sh"
step "podman: images"
podman_install
podman --version
FS_STANDIN_TAG=$(scripts/container-images.sh | tail -1 | sed 's/^FS_STANDIN_TAG=//')
BIN=${FLASHSALE_BIN:-${CARGO_TARGET_DIR:-$FS_ROOT/target}/release/flashsale}
if [ -z "${FLASHSALE_BIN:-}" ]; then
  step "cargo build --release --locked --bin flashsale"
  cargo build --release --locked --bin flashsale
fi
[ -x "$BIN" ] || fail "no binary at $BIN"

STATE=$(mktemp -d /tmp/fs-kube-check.XXXXXX)
NET=fs-kube-check-$$
PLAYED=()       # the played files, for kube down
SECRETS=()      # podman secrets made
PODS=()         # every pod the played files make
VOLUMES=()      # the volumes of their containers (emptyDir's, configMap's)
NET_MADE=
collect_volumes() {
  local p c
  for p in "${PODS[@]}"; do
    for c in $(podman pod inspect "$p" --format '{{range .Containers}}{{.Name}} {{end}}' 2>/dev/null); do
      # shellcheck disable=SC2207
      VOLUMES+=($(podman inspect "$c" --format '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}' 2>/dev/null))
    done
  done
}
cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ] && [ ${#PODS[@]} -gt 0 ]; then
    for p in "${PODS[@]}"; do
      for c in $(podman pod inspect "$p" --format '{{range .Containers}}{{.Name}} {{end}}' 2>/dev/null); do
        case $c in *-infra) continue ;; esac
        timeout 20 podman logs "$c" >"$STATE/$c.log" 2>&1 && { echo "--- $c (last lines; $STATE/$c.log)"; tail -8 "$STATE/$c.log"; } >&2
      done
    done
  fi
  collect_volumes
  for ((i = ${#PLAYED[@]} - 1; i >= 0; i--)); do
    timeout -k 5 120 podman kube down "${PLAYED[$i]}" >/dev/null 2>&1
  done
  # Whatever kube down left (a pod it never made, a play cut short).
  for p in "${PODS[@]}"; do
    podman pod exists "$p" 2>/dev/null && timeout -k 5 60 podman pod rm -f -t 5 "$p" >/dev/null 2>&1
  done
  for v in "${VOLUMES[@]}"; do
    podman volume exists "$v" 2>/dev/null && podman volume rm -f "$v" >/dev/null 2>&1
  done
  for s in "${SECRETS[@]}"; do podman secret rm "$s" >/dev/null 2>&1; done
  [ -n "$NET_MADE" ] && podman network rm -f "$NET" >/dev/null 2>&1
  [ $rc -eq 0 ] && rm -rf "$STATE"
  [ $rc -ne 0 ] && echo "the run's files: $STATE" >&2
  step "done (exit $rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "the image localhost/flashsale:latest (Dockerfile, target runtime-prebuilt, on localhost/debian:bookworm)"
# A build context of its own: the Dockerfile, the health check and the
# binary stripped as the Dockerfile's build stage leaves it (nothing of
# this tree's target/ is written).
mkdir -p "$STATE/image/deploy" "$STATE/image/target/prebuilt"
cp Dockerfile "$STATE/image/"
cp deploy/healthcheck.sh "$STATE/image/deploy/"
install -m 755 "$BIN" "$STATE/image/target/prebuilt/flashsale"
strip "$STATE/image/target/prebuilt/flashsale"
OLD_IMAGE=$(podman image inspect localhost/flashsale:latest --format '{{.Id}}' 2>/dev/null || true)
# Docker's image format, as `docker build` makes it: OCI has no HEALTHCHECK.
timeout 900 podman build -q --format docker --network host --target runtime-prebuilt \
  --build-arg RUNTIME_BASE=localhost/debian:bookworm \
  --build-arg PREBUILT=target/prebuilt/flashsale \
  -t localhost/flashsale:latest "$STATE/image" >/dev/null
NEW_IMAGE=$(podman image inspect localhost/flashsale:latest --format '{{.Id}}')
if [ -n "$OLD_IMAGE" ] && [ "$OLD_IMAGE" != "$NEW_IMAGE" ]; then
  podman rmi "$OLD_IMAGE" >/dev/null 2>&1 || true
fi
[ "$(podman image inspect localhost/flashsale:latest --format '{{.Config.User}}')" = flashsale ] \
  || fail "the image does not run as the user flashsale"

# The played copies (see the header for what differs), the secrets' JSON,
# this run's random secrets, and the names of the pods they make.
ADMIN_TOKEN=$(openssl rand -hex 24)
JWT_SECRET=$(openssl rand -hex 32)
DB_PASSWORD=$(openssl rand -hex 16)
DB_ROOT_PASSWORD=$(openssl rand -hex 16)
export ADMIN_TOKEN JWT_SECRET DB_PASSWORD DB_ROOT_PASSWORD FS_STANDIN_TAG
"$PY" - "$STATE" "$KDIR" <<'PY'
import base64, json, os, sys, yaml
state, kdir = sys.argv[1:]
fill = {
    "ADMIN_TOKEN": os.environ["ADMIN_TOKEN"],
    "JWT_SECRET": os.environ["JWT_SECRET"],
    "MARIADB_PASSWORD": os.environ["DB_PASSWORD"],
    "MARIADB_ROOT_PASSWORD": os.environ["DB_ROOT_PASSWORD"],
}
standins = {
    "docker.io/library/redis:7": "localhost/flashsale-test/redis:" + os.environ["FS_STANDIN_TAG"],
    "docker.io/library/mariadb:10.11": "localhost/flashsale-test/mariadb:" + os.environ["FS_STANDIN_TAG"],
}
pods, secrets, volumes, kept_volumes = [], [], [], []
def play(out, files):
    docs = [d for f in files for d in yaml.safe_load_all(open(os.path.join(kdir, f)))]
    kept = []
    for d in docs:
        if d["kind"] == "Secret":
            data = {}
            for k, v in d.get("stringData", {}).items():
                if k == "DATABASE_URL":
                    v = v.replace("CHANGE-ME-db-password", os.environ["DB_PASSWORD"])
                else:
                    v = fill[k]
                assert "CHANGE-ME" not in v, k
                data[k] = base64.b64encode(v.encode()).decode()
            name = d["metadata"]["name"]
            with open(os.path.join(state, f"secret-{name}.json"), "w") as f:
                json.dump(data, f)
            secrets.append(name)
            continue
        if d["kind"] in ("Deployment", "Pod"):
            spec = d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"]
            # The volumes kube play makes, by name: an emptyDir's (named
            # as the volume: one for every pod using the name; kube down
            # removes it), a configMap's (named after the ConfigMap) and a
            # claim's (kube down keeps these).
            for v in spec.get("volumes", []):
                if "emptyDir" in v:
                    volumes.append(v["name"])
                if "configMap" in v:
                    volumes.append(v["configMap"]["name"])
                    kept_volumes.append(v["configMap"]["name"])
                if "persistentVolumeClaim" in v:
                    volumes.append(v["persistentVolumeClaim"]["claimName"])
                    kept_volumes.append(v["persistentVolumeClaim"]["claimName"])
            for c in spec["containers"]:
                c.pop("ports", None)
                c["image"] = standins.get(c["image"], c["image"])
            name = d["metadata"]["name"]
            pods.extend([f"{name}-pod-{i}" for i in range(d["spec"].get("replicas", 1))]
                        if d["kind"] == "Deployment" else [name])
        kept.append(d)
    with open(os.path.join(state, out), "w") as f:
        yaml.safe_dump_all(kept, f, sort_keys=False)
play("play-stores.yaml", ["dev/stores.yaml"])
play("play-app.yaml", ["configmap.yaml", "secret.yaml", "api.yaml", "worker.yaml"])
open(os.path.join(state, "pods"), "w").write("\n".join(pods) + "\n")
open(os.path.join(state, "secrets"), "w").write("\n".join(secrets) + "\n")
open(os.path.join(state, "volumes"), "w").write("".join(v + "\n" for v in sorted(set(volumes))))
open(os.path.join(state, "kept-volumes"), "w").write("".join(v + "\n" for v in sorted(set(kept_volumes))))
PY
# The processes' own check of their settings (`--dry-run`), with each
# container's environment as Kubernetes would make it from the manifests:
# with the Secret's placeholders, `serve` must refuse (ADMIN_TOKEN); with
# this run's values, both must take every setting.
# env_of DIR DEPLOYMENT: NAME=VALUE lines (configMapRef, secretKeyRef,
# fieldRef metadata.name resolved).
env_of() {
  "$PY" - "$@" <<'PY'
import base64, glob, os, sys, yaml
folder, name = sys.argv[1:]
docs = [d for f in sorted(glob.glob(os.path.join(folder, "*.yaml"))) for d in yaml.safe_load_all(open(f))]
by = lambda kind, n: next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == n)
secret = lambda n: {**{k: base64.b64decode(v).decode() for k, v in by("Secret", n).get("data", {}).items()},
                    **by("Secret", n).get("stringData", {})}
c = by("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
env = {}
for ref in c.get("envFrom", []):
    env.update(by("ConfigMap", ref["configMapRef"]["name"])["data"])
for e in c.get("env", []):
    if "value" in e:
        env[e["name"]] = e["value"]
    elif "secretKeyRef" in e["valueFrom"]:
        r = e["valueFrom"]["secretKeyRef"]
        env[e["name"]] = secret(r["name"])[r["key"]]
    elif e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name":
        env[e["name"]] = name + "-5d8f7c9b6-x2x4q"
for k, v in env.items():
    print(f"{k}={v}")
PY
}
dry_run() { # folder deployment command
  local vars
  mapfile -t vars < <(env_of "$1" "$2")
  timeout 20 env -i "PATH=$PATH" "${vars[@]}" "$BIN" "$3" --dry-run
}
out=$(dry_run "$KDIR" flashsale-api serve 2>&1) && fail "serve took the Secret's placeholders: $out"
grep -q 'ADMIN_TOKEN looks like a placeholder' <<<"$out" || fail "serve refused the placeholders, but not for ADMIN_TOKEN: $out"
mkdir -p "$STATE/filled"
cp "$KDIR"/*.yaml "$STATE/filled/"
"$PY" - "$STATE/filled/secret.yaml" <<'PY'
import os, sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["stringData"] = {"ADMIN_TOKEN": os.environ["ADMIN_TOKEN"], "JWT_SECRET": os.environ["JWT_SECRET"],
                   "DATABASE_URL": d["stringData"]["DATABASE_URL"].replace("CHANGE-ME-db-password", os.environ["DB_PASSWORD"])}
yaml.safe_dump(d, open(sys.argv[1], "w"))
PY
dry_run "$STATE/filled" flashsale-api serve >"$STATE/serve-dry-run.txt" 2>&1 || { cat "$STATE/serve-dry-run.txt" >&2; fail "serve --dry-run"; }
dry_run "$STATE/filled" flashsale-worker worker >"$STATE/worker-dry-run.txt" 2>&1 || { cat "$STATE/worker-dry-run.txt" >&2; fail "worker --dry-run"; }
step "--dry-run: serve refuses the Secret's placeholders (ADMIN_TOKEN); with real values serve and worker take every setting"

# The played copies are still valid manifests (nothing but the three
# points above changed).
out=$("$VENV/bin/kubernetes-validate" --strict --quiet "$STATE/play-stores.yaml" "$STATE/play-app.yaml" 2>&1) \
  || { echo "$out" >&2; fail "the played copies do not validate"; }
[ -z "$out" ] || { echo "$out" >&2; fail "the played copies do not validate"; }

mapfile -t WANT_PODS <"$STATE/pods"
mapfile -t WANT_SECRETS <"$STATE/secrets"
mapfile -t WANT_VOLUMES <"$STATE/volumes"
mapfile -t KEPT_VOLUMES <"$STATE/kept-volumes"
for p in "${WANT_PODS[@]}"; do
  podman pod exists "$p" && fail "a pod $p exists already (an earlier run cut short? podman pod rm -f $p)"
done
for s in "${WANT_SECRETS[@]}"; do
  podman secret inspect "$s" >/dev/null 2>&1 && fail "a podman secret $s exists already (podman secret rm $s)"
done
for v in "${WANT_VOLUMES[@]}"; do
  podman volume exists "$v" && fail "a podman volume $v exists already (podman volume rm $v)"
done
PODS=("${WANT_PODS[@]}")
VOLUMES=("${WANT_VOLUMES[@]}")
podman network create "$NET" >/dev/null
NET_MADE=1
for s in "${WANT_SECRETS[@]}"; do
  podman secret create "$s" "$STATE/secret-$s.json" >/dev/null
  SECRETS+=("$s")
done
step "podman secrets ${SECRETS[*]}; network $NET; pods to come: ${PODS[*]}"

# bounded WHAT SECS COMMAND...: COMMAND until it succeeds, SECS at most.
bounded() {
  local what=$1 secs=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$what: not within ${secs}s"
    sleep 1
  done
}
inside() { local secs=$1; shift; timeout -k 5 "$secs" podman exec "$@"; }
sql() { inside 20 mariadb-mariadb mariadb -uroot -N -e "$1"; }

step "podman kube play dev/stores.yaml (redis, mariadb)"
PLAYED+=("$STATE/play-stores.yaml")
timeout -k 5 180 podman kube play --network "$NET" "$STATE/play-stores.yaml" >"$STATE/play-stores.out" 2>&1 \
  || { cat "$STATE/play-stores.out" >&2; fail "podman kube play dev/stores.yaml"; }
redis_up() { [ "$(inside 10 redis-redis redis-cli ping)" = PONG ]; }
bounded "redis answers" 60 redis_up
bounded "mariadb up (healthcheck.sh --connect --innodb_initialized)" 120 \
  inside 10 mariadb-mariadb healthcheck.sh --connect --innodb_initialized
# The init ConfigMap, mounted as the manifest asks.
INIT_SQL=$("$PY" -c '
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d["kind"] == "ConfigMap": print(d["data"]["grants.sql"], end="")' "$STATE/play-stores.yaml")
[ "$(inside 10 mariadb-mariadb cat /docker-entrypoint-initdb.d/grants.sql)" = "$(printf '%s' "$INIT_SQL")" ] \
  || fail "the init ConfigMap is not at /docker-entrypoint-initdb.d/grants.sql"
# What the official image does on an empty datadir from MARIADB_DATABASE,
# MARIADB_USER and MARIADB_PASSWORD (the stand-in does not), then the init
# ConfigMap's SQL as it would.
inside 20 -i mariadb-mariadb mariadb -uroot <<SQL || fail "making the flashsale account"
CREATE DATABASE IF NOT EXISTS flashsale;
CREATE USER IF NOT EXISTS 'flashsale'@'%' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON flashsale.* TO 'flashsale'@'%';
SQL
inside 20 -i mariadb-mariadb mariadb -uroot <<<"$INIT_SQL" || fail "the init ConfigMap's SQL"
step "stores up: redis PONG, mariadb (account flashsale made, init SQL run)"

step "podman kube play configmap.yaml api.yaml worker.yaml (the Secret as a podman secret)"
PLAYED+=("$STATE/play-app.yaml")
timeout -k 5 180 podman kube play --network "$NET" "$STATE/play-app.yaml" >"$STATE/play-app.out" 2>&1 \
  || { cat "$STATE/play-app.out" >&2; fail "podman kube play the service"; }
API_PODS=() WORKER_PODS=()
for p in "${PODS[@]}"; do
  case $p in flashsale-api-pod-*) API_PODS+=("$p") ;; flashsale-worker-pod-*) WORKER_PODS+=("$p") ;; esac
done
{ [ ${#API_PODS[@]} = 2 ] && [ ${#WORKER_PODS[@]} = 2 ]; } || fail "pods: ${PODS[*]}"
for p in "${PODS[@]}"; do
  [ "$(podman pod inspect "$p" --format '{{.State}}')" = Running ] || fail "pod $p is not running"
done
echo "   the API's livenessProbe, as podman made it: health check $(podman inspect "${API_PODS[0]}-api" \
  --format '{{json .Config.Healthcheck.Test}}, on failure: {{.Config.HealthcheckOnFailureAction}}'); stop timeout $(podman inspect "${API_PODS[0]}-api" --format '{{.Config.StopTimeout}}')s"

# http CONTAINER METHOD PATH [BODY] [BEARER]: a request to the API on the
# container's own port (bash's /dev/tcp); prints the status, then the body.
http() {
  local raw
  # shellcheck disable=SC2016 # the container's bash expands them
  raw=$(inside 20 "$1" bash -c '
    exec 3<>/dev/tcp/127.0.0.1/8080 || exit 1
    head="$1 $2 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    [ -n "$4" ] && head+="Authorization: Bearer $4\r\n"
    [ -n "$3" ] && head+="Content-Type: application/json\r\n"
    printf "${head}Content-Length: %d\r\n\r\n%s" "${#3}" "$3" >&3
    timeout 10 cat <&3' _ "$2" "$3" "${4:-}" "${5:-}") || return 1
  "$PY" -c '
import sys
raw = sys.argv[1]
head, _, body = raw.partition("\r\n\r\n")
print(head.split()[1]); print(body)' "$raw"
}
ready() { [ "$(http "$1-api" GET /readyz | head -1)" = 200 ]; }
for p in "${API_PODS[@]}"; do bounded "$p ready (/readyz)" 120 ready "$p"; done
step "ready: ${API_PODS[*]} ($(http "${API_PODS[0]}-api" GET /readyz | tail -1))"

# A sale and an order, as scripts/fresh-machine-check.sh places them; the
# order with a buyer's JWT signed by the Secret's JWT_SECRET, through the
# other API pod.
SKU=kc-$(date +%s)
NOW=$(($(date +%s) * 1000))
A=${API_PODS[0]}-api
B=${API_PODS[1]}-api
created=$(http "$A" POST /api/admin/products \
  "{\"product_id\":\"$SKU\",\"title\":\"Kube check\",\"price\":\"10.00\",\"available_qty\":3,\"start_time\":$NOW,\"end_time\":$((NOW + 3600000)),\"limit_per_user\":1}" \
  "$ADMIN_TOKEN")
opened=$(http "$A" POST "/api/admin/products/$SKU/open" "" "$ADMIN_TOKEN")
JWT=$("$PY" -c '
import base64, hashlib, hmac, json, os, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
msg = b64(b"{\"alg\":\"HS256\",\"typ\":\"JWT\"}") + "." + b64(json.dumps({"sub": "1", "exp": int(time.time()) + 600}).encode())
print(msg + "." + b64(hmac.new(os.environ["JWT_SECRET"].encode(), msg.encode(), hashlib.sha256).digest()))')
ordered=$(http "$B" POST /api/orders "{\"product_id\":\"$SKU\",\"quantity\":1}" "$JWT")
for r in created opened ordered; do echo "   $r: $(tr '\n' ' ' <<<"${!r}")"; done
codes="$(head -1 <<<"$created") $(head -1 <<<"$opened") $(head -1 <<<"$ordered")"
[ "$codes" = "201 200 202" ] || fail "create, open, order: HTTP $codes (wanted 201 200 202)"
ORDER_ID=$(tail -1 <<<"$ordered" | sed -n 's/.*"order_id":"\([^"]*\)".*/\1/p')
[ -n "$ORDER_ID" ] || fail "no order_id in the order's answer"
step "order $ORDER_ID accepted (202) by ${API_PODS[1]}; waiting for its row in tb_order"

row_confirmed() {
  [ "$(sql "SELECT CONCAT(order_id, ' ', user_id, ' ', status) FROM flashsale.tb_order WHERE product_id = '$SKU'")" = "$ORDER_ID 1 confirmed" ]
}
bounded "the order's row in tb_order, confirmed" 60 row_confirmed
step "tb_order: $(sql "SELECT order_id, user_id, status FROM flashsale.tb_order WHERE product_id = '$SKU'" | tr '\t' ' ')"
# The service signed in with the Secret's DATABASE_URL (user and password).
users=$(sql "SELECT DISTINCT user FROM information_schema.processlist WHERE db = 'flashsale' ORDER BY user" | tr '\n' ' ')
[ "$users" = "flashsale " ] || fail "the service's MariaDB sessions are of: $users (wanted flashsale only)"

consumers() {
  inside 10 redis-redis redis-cli XINFO CONSUMERS "fs:{$SKU}:orders" persist \
    | awk 'prev == "name" { print } { prev = $0 }' | sort | tr '\n' ' '
}
want_consumers="$(printf '%s\n' "${WORKER_PODS[@]}" | sort | tr '\n' ' ')"
both_consumers() { [ "$(consumers)" = "$want_consumers" ]; }
bounded "both workers in the sale's consumer group under their pod names" 60 both_consumers
step "consumers of fs:{$SKU}:orders: $(consumers)"

# The securityContext in force: non-root, a read-only root, nothing in /tmp.
for c in "$A" "${WORKER_PODS[0]}-worker"; do
  [ "$(inside 10 "$c" id -u):$(inside 10 "$c" id -g)" = 10001:10001 ] || fail "$c: not uid/gid 10001"
  inside 10 "$c" bash -c ': >/probe' 2>/dev/null && fail "$c: the root file system is writable"
  [ -z "$(inside 10 "$c" ls -A /tmp)" ] || fail "$c: files in /tmp: $(inside 10 "$c" ls -A /tmp)"
done
step "uid/gid 10001, root file system read-only, /tmp empty: $A, ${WORKER_PODS[0]}-worker"
timeout 30 podman stats --no-stream --format '{{.Name}} {{.MemUsage}} {{.CPUPerc}}' \
  "${API_PODS[@]/%/-api}" "${WORKER_PODS[@]/%/-worker}" 2>/dev/null | sed 's/^/   /' || true

# SIGTERM, as the kubelet sends it after the preStop hook (which podman
# does not run), with the manifests' grace: each process drains and exits 0.
grace() { # deployment
  "$PY" -c '
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d["metadata"]["name"] == sys.argv[2] and d["kind"] == "Deployment":
        print(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])' "$STATE/play-app.yaml" "$1"
}
for c in "${API_PODS[1]}-api:flashsale-api" "${WORKER_PODS[1]}-worker:flashsale-worker"; do
  name=${c%%:*} g=$(grace "${c#*:}")
  t0=$(date +%s.%N)
  timeout -k 5 $((g + 30)) podman stop -t "$g" "$name" >/dev/null
  t1=$(date +%s.%N)
  exit_code=$(podman inspect "$name" --format '{{.State.ExitCode}}')
  took=$("$PY" -c "print(f'{$t1 - $t0:.1f}')")
  step "SIGTERM to $name: exited $exit_code after ${took}s (grace ${g}s)"
  [ "$exit_code" = 0 ] || fail "$name did not exit cleanly on SIGTERM (exit $exit_code)"
  "$PY" -c "import sys; sys.exit(0 if $t1 - $t0 < $g else 1)" || fail "$name outlasted its grace"
done

step "podman kube down"
collect_volumes
for ((i = ${#PLAYED[@]} - 1; i >= 0; i--)); do
  t0=$(date +%s)
  timeout -k 5 120 podman kube down "${PLAYED[$i]}" >/dev/null 2>&1 || fail "podman kube down $(basename "${PLAYED[$i]}")"
  echo "   $(basename "${PLAYED[$i]}"): $(($(date +%s) - t0))s"
done
PLAYED=()
LEFT=$( {
  for p in "${PODS[@]}"; do podman pod exists "$p" && echo "pod $p"; done
  podman ps -a --format '{{.Names}}' | grep -E "^($(IFS='|'; echo "${PODS[*]}"))-" | sed 's/^/container /'
  for v in "${VOLUMES[@]}"; do podman volume exists "$v" && echo "volume $v"; done
} | sort -u || true)
# kube down keeps the named volumes kube play made (the init ConfigMap's);
# the secrets and the network are this check's own.
want_left=$(for v in "${KEPT_VOLUMES[@]}"; do echo "volume $v"; done | sort -u)
[ "$LEFT" = "$want_left" ] || fail "left behind by kube down: $LEFT"
for v in "${KEPT_VOLUMES[@]}"; do podman volume rm "$v" >/dev/null || fail "podman volume rm $v"; done
for s in "${SECRETS[@]}"; do podman secret rm "$s" >/dev/null || fail "podman secret rm $s"; done
SECRETS=()
podman network rm "$NET" >/dev/null || fail "podman network rm $NET"
NET_MADE=
step "kube down removed the pods and the emptyDir volumes, and left ${KEPT_VOLUMES[*]:-nothing} (a configMap volume): removed, with the secrets and the network"
LEFT=$( {
  for p in "${PODS[@]}"; do podman pod exists "$p" && echo "pod $p"; done
  podman ps -a --format '{{.Names}}' | grep -E "^($(IFS='|'; echo "${PODS[*]}"))-" | sed 's/^/container /'
  for v in "${VOLUMES[@]}"; do podman volume exists "$v" && echo "volume $v"; done
  for s in "${WANT_SECRETS[@]}"; do podman secret inspect "$s" >/dev/null 2>&1 && echo "secret $s"; done
  podman network exists "$NET" && echo "network $NET"
} | sort -u || true)
[ -z "$LEFT" ] || fail "left behind: $LEFT"
step "PASS: validated ($KUBE_VERSIONS, strict); played under $(podman --version); nothing of the run left"
