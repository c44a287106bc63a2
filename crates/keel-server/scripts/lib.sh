# Helpers the measurement scripts here share: `source "$(dirname "$0")/lib.sh"`.

# Seconds of CPU (user + system) the process $1 has used.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ print ($14 + $15) / t }' "/proc/$1/stat"; }

# Resident memory of the process $1, in KiB.
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# Waits (up to 10 s) until something accepts connections on 127.0.0.1:$port.
# (redis-benchmark waits forever on a refused connection; redis-cli may be missing.)
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server on $port did not start" >&2; return 1
}
