# Network namespaces as test hosts on one machine (sourced by the multihost tests; facts and the
# safety rule from ../shared/reference/multihost.md §1): N namespaces $KILN_LAB_PREFIX"n1".."nN",
# each with a veth into one bridge, addresses 10.247.2.1..N/24, no default route.
#
# Safety: before any address exists, the root namespace gets an `unreachable 10.247.2.0/24`
# guard route (metric 4000) and the bridge gets 10.247.2.254/24, so that nothing the tests send
# to the test subnet can ever leave through the machine's real interface; the guard stays until
# lab_down has removed everything else.
#
#   . tests/multihost/lab.sh
#   KILN_LAB_PREFIX=kmh; lab_up 2 || exit 77    # 1: not root / no netns support (skip)
#   trap 'lab_down 2' EXIT
#   ip netns exec kmhn1 ...                     # processes inside are killed by lab_down
KILN_LAB_SUBNET=10.247.2

lab_up() {  # lab_up N: 0 ok, 1 cannot (not root, no ip/unshare, netns refused)
  n=$1
  [ "$(id -u)" -eq 0 ] || { echo "lab: needs root"; return 1; }
  command -v ip >/dev/null 2>&1 || { echo "lab: no ip(8)"; return 1; }
  command -v unshare >/dev/null 2>&1 || { echo "lab: no unshare(1)"; return 1; }
  lab_down "$n" 2>/dev/null  # what a killed earlier run left
  ip route add unreachable "$KILN_LAB_SUBNET.0/24" metric 4000 || { echo "lab: no guard route"; return 1; }
  br="${KILN_LAB_PREFIX}br0"
  if ! ip link add "$br" type bridge; then
    ip route del unreachable "$KILN_LAB_SUBNET.0/24" metric 4000
    echo "lab: cannot create a bridge"
    return 1
  fi
  ip link set "$br" up && ip addr add "$KILN_LAB_SUBNET.254/24" dev "$br" || return 1
  i=1
  while [ "$i" -le "$n" ]; do
    ns="${KILN_LAB_PREFIX}n$i"
    ip netns add "$ns" || { echo "lab: ip netns add refused"; return 1; }
    ip link add "${KILN_LAB_PREFIX}h$i" type veth peer name veth0 netns "$ns" || return 1
    ip link set "${KILN_LAB_PREFIX}h$i" master "$br" && ip link set "${KILN_LAB_PREFIX}h$i" up &&
      ip -n "$ns" link set lo up && ip -n "$ns" addr add "$KILN_LAB_SUBNET.$i/24" dev veth0 &&
      ip -n "$ns" link set veth0 up || return 1
    i=$((i + 1))
  done
  return 0
}

lab_kill() {  # lab_kill I: SIGKILL every process inside namespace I
  pids=$(ip netns pids "${KILN_LAB_PREFIX}n$1" 2>/dev/null)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  return 0
}

lab_down() {  # lab_down N: kills what runs inside, removes namespaces, bridge and guard route
  n=$1
  i=1
  while [ "$i" -le "$n" ]; do
    lab_kill "$i"
    # The veth pair goes with its host side at once; a deleted namespace frees its end only when
    # the kernel's asynchronous cleanup runs, which can outlast the next lab_up.
    ip link del "${KILN_LAB_PREFIX}h$i" 2>/dev/null
    ip netns del "${KILN_LAB_PREFIX}n$i" 2>/dev/null
    i=$((i + 1))
  done
  ip link del "${KILN_LAB_PREFIX}br0" 2>/dev/null
  ip route del unreachable "$KILN_LAB_SUBNET.0/24" metric 4000 2>/dev/null
  return 0
}
