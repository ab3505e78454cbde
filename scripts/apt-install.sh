# Sourced by scripts/setup.sh and scripts/zookeeper.sh: `apt_install PACKAGE…` installs Debian
# packages (apt-get update once, then apt-get install). On a machine others share, another
# apt-get, dpkg or unattended-upgrades may hold the package lock. apt-get install waits for the
# dpkg lock itself (DPkg::Lock::Timeout); apt-get update does not wait for the lists lock, so
# this tries it again every APT_LOCK_POLL_S seconds. Either way the wait is bounded by
# APT_LOCK_TIMEOUT_S (default 600 s), said before it starts, and said again when it gives up.
# Needs `say` (the caller's progress line) and SUDO.
APT_LOCK_TIMEOUT_S="${APT_LOCK_TIMEOUT_S:-600}"
APT_LOCK_POLL_S="${APT_LOCK_POLL_S:-5}"
if ! [[ $APT_LOCK_TIMEOUT_S =~ ^[0-9]+$ ]]; then
  say "APT_LOCK_TIMEOUT_S must be a whole number of seconds, got '$APT_LOCK_TIMEOUT_S'"
  exit 2
fi
# apt's words for a lock another process holds (the lists lock, the dpkg lock, the frontend lock).
APT_LOCK_HELD='Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock (the )?(directory|administration)'
apt_updated=0

# The package managers running now, as `apt-get (pid 812), dpkg (pid 840)`; empty when none.
apt_lock_holders() {
  { pgrep -a -x 'apt-get|apt|dpkg|aptitude|unattended-upgr' 2>/dev/null || true; } |
    awk '{ printf "%s%s (pid %s)", (NR > 1 ? ", " : ""), $2, $1 }'
}

# apt_get ARGS…: apt-get, waiting for a package lock another process holds, at most APT_LOCK_TIMEOUT_S.
apt_get() {
  local start=$SECONDS said=0 status out holders remaining
  while :; do
    remaining=$((APT_LOCK_TIMEOUT_S - (SECONDS - start)))
    ((remaining < 0)) && remaining=0
    holders=$(apt_lock_holders)
    if [ -n "$holders" ] && [ "$said" = 0 ] && ((remaining > 0)); then
      say "another package manager runs ($holders): waiting up to ${APT_LOCK_TIMEOUT_S} s for the package lock (APT_LOCK_TIMEOUT_S)"
      said=1
    fi
    status=0
    out=$(DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout="$remaining" "$@" 2>&1 >/dev/null) || status=$?
    [ "$status" = 0 ] && return 0
    if ! grep -qE "$APT_LOCK_HELD" <<<"$out"; then
      printf '%s\n' "$out" >&2
      return "$status"
    fi
    if ((SECONDS - start >= APT_LOCK_TIMEOUT_S)); then
      printf '%s\n' "$out" >&2
      say "gave up after ${APT_LOCK_TIMEOUT_S} s: the package lock is still held${holders:+ ($holders)}; run this again once it is free, or set APT_LOCK_TIMEOUT_S higher"
      return "$status"
    fi
    if [ "$said" = 0 ]; then
      say "the package lock is held${holders:+ ($holders)}: waiting up to ${APT_LOCK_TIMEOUT_S} s for it (APT_LOCK_TIMEOUT_S)"
      said=1
    fi
    sleep "$APT_LOCK_POLL_S"
  done
}

apt_install() {
  if [ "$apt_updated" = 0 ]; then apt_get update -qq || true; apt_updated=1; fi
  apt_get install -y -qq --no-install-recommends "$@"
}
