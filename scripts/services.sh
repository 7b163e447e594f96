# PostgreSQL and Redis for the tests and the benchmarks, sourced by scripts/test.sh
# and bench/lib.sh:
#
#   source scripts/services.sh; ensure_postgres; ensure_redis
#
# Each reuses a service that already answers on its standard port on 127.0.0.1
# (never restarting it), else installs it from Debian when missing and starts it.
# They export DATABASE_URL and REDIS_URL (kept when already set).
#
# PostgreSQL as Debian ships it asks for a password over TCP (scram-sha-256) and
# its `postgres` role has none. When DATABASE_URL is not given and the passwordless
# URL is refused, the role gets the password `postgres` through the local peer
# login — on a machine whose cluster this script started or installed, or under CI
# (a throwaway machine); never on a developer's running cluster (there
# DATABASE_URL must say how to connect).

_svc_log() { printf '\n==> %s\n' "$*" >&2; }
_svc_sudo() { if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi; }

_SVC_APT_UPDATED=${_SVC_APT_UPDATED:-0}
svc_apt_install() {
    if [ "$_SVC_APT_UPDATED" -eq 0 ]; then
        _svc_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        _SVC_APT_UPDATED=1
    fi
    _svc_log "apt-get install $*"
    _svc_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# True when something accepts TCP connections on 127.0.0.1:$1.
svc_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

svc_wait_port() {
    local port=$1 name=$2 _
    for _ in $(seq 1 60); do
        if svc_port_open "$port"; then return 0; fi
        sleep 0.5
    done
    echo "error: $name did not start on 127.0.0.1:$port" >&2
    return 1
}

ensure_postgres() {
    local started=0 version
    if svc_port_open 5432; then
        _svc_log "PostgreSQL already running on 127.0.0.1:5432: reusing it"
    else
        if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
            svc_apt_install postgresql postgresql-contrib
        fi
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
        _svc_log "starting PostgreSQL $version"
        _svc_sudo pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
        svc_wait_port 5432 PostgreSQL || return 1
        started=1
    fi
    command -v psql >/dev/null 2>&1 || svc_apt_install postgresql-client
    if [ -z "${DATABASE_URL:-}" ]; then
        local plain=postgres://postgres@127.0.0.1:5432/postgres
        local with_password=postgres://postgres:postgres@127.0.0.1:5432/postgres
        if psql "$plain" -Atqc 'SELECT 1' >/dev/null 2>&1; then
            export DATABASE_URL=$plain
        elif psql "$with_password" -Atqc 'SELECT 1' >/dev/null 2>&1; then
            export DATABASE_URL=$with_password
        elif [ "$started" = 1 ] || [ -n "${CI:-}" ]; then
            _svc_sudo su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null
            export DATABASE_URL=$with_password
        else
            echo "error: PostgreSQL on 127.0.0.1:5432 refuses postgres without a password; set DATABASE_URL" >&2
            return 1
        fi
    fi
    psql "$DATABASE_URL" -Atqc 'SELECT 1' >/dev/null || {
        echo "error: cannot connect with DATABASE_URL" >&2
        return 1
    }
}

ensure_redis() {
    if svc_port_open 6379; then
        _svc_log "Redis already running on 127.0.0.1:6379: reusing it"
    else
        command -v redis-server >/dev/null 2>&1 || svc_apt_install redis-server
        _svc_log "starting Redis"
        local dir
        dir=$(mktemp -d)
        redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
            --dir "$dir" --logfile "$dir/redis.log"
        svc_wait_port 6379 Redis || return 1
    fi
    command -v redis-cli >/dev/null 2>&1 || svc_apt_install redis-tools
    export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
}
