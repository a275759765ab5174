#!/usr/bin/env bash
# The previous release's binary, for running it beside this tree's (the
# mixed-version trial, docs/operations.md "Upgrading"): prints its path.
#
# The previous release is the newest one CHANGELOG.md lists after
# [Unreleased]; its commit is the CHANGELOG's link line for it (so a clone
# without tags finds it), checked against its tag `v<version>` when the tag
# is here. Built once per commit, from a git worktree of that commit, with
# `cargo build --locked --bin flashsale` (PROFILE: dev by default, as the
# tests' own binary; release with PROFILE=release) into a target dir of its
# own, and cached by commit under FLASHSALE_RELEASES
# (default ~/.cache/flashsale/releases/<commit>/<profile>/flashsale): a warm
# run builds nothing. Progress goes to stderr; stdout is the path alone.
set -euo pipefail
FS_ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$FS_ROOT"
PROFILE=${PROFILE:-dev}
CACHE=${FLASHSALE_RELEASES:-$HOME/.cache/flashsale/releases}
say() { echo "previous-release: $*" >&2; }

# The first "[x.y.z]: ... commit <hash>" link line of the CHANGELOG.
line=$(grep -m1 -E '^\[[0-9]+\.[0-9]+\.[0-9]+\]: .*commit [0-9a-f]{40}' CHANGELOG.md) \
  || { say "no released version in CHANGELOG.md"; exit 1; }
version=$(sed -E 's/^\[([^]]+)\].*/\1/' <<<"$line")
commit=$(grep -oE '[0-9a-f]{40}' <<<"$line")
if tagged=$(git rev-parse -q --verify "refs/tags/v$version^{commit}" 2>/dev/null); then
  [ "$tagged" = "$commit" ] || { say "tag v$version is $tagged, the CHANGELOG says $commit"; exit 1; }
fi
git cat-file -e "$commit^{commit}" 2>/dev/null \
  || { say "commit $commit of $version is not in this clone (git fetch --tags)"; exit 1; }

dir_profile=$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")
bin="$CACHE/$commit/$dir_profile/flashsale"
if [ -x "$bin" ]; then
  say "$version ($commit), $PROFILE: cached"
  echo "$bin"
  exit 0
fi
say "$version ($commit), $PROFILE: building (minutes, once per commit)"
src="$CACHE/$commit/src"
target="$CACHE/target"   # shared by the previous releases' builds: their dependencies mostly agree
mkdir -p "$CACHE/$commit"
rm -rf "$src"
git worktree prune
git worktree add --detach --force "$src" "$commit" >&2
trap 'git -C "$FS_ROOT" worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"' EXIT
(cd "$src" && FLASHSALE_COMMIT=${commit:0:12} CARGO_TARGET_DIR="$target" \
  cargo build --locked --profile "$PROFILE" --bin flashsale >&2)
install -D -m 755 "$target/$dir_profile/flashsale" "$bin.tmp"
mv "$bin.tmp" "$bin"
say "built $bin"
echo "$bin"
