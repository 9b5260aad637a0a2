#!/usr/bin/env bash
# Certificates and keys for a Flower deployment with TLS and SuperNode authentication.
#
#   bash scripts/gen_certs.sh OUT_DIR --supernodes N [--hosts NAME_OR_IP[,NAME_OR_IP...]] [--days DAYS]
#
# Writes into OUT_DIR:
#   ca.crt, ca.key          a private CA (EC P-384). ca.crt goes to every SuperNode and
#                           `flwr` user (--root-certificates / root-certificates);
#                           ca.key stays with the administrator.
#   server.crt, server.key  the SuperLink's TLS certificate, signed by the CA, valid for
#                           localhost, 127.0.0.1, ::1 and every --hosts entry (names or IPs
#                           the SuperNodes use to reach the SuperLink).
#   supernode-I.key         SuperNode I's private key (I = 0..N-1, one per home; the index
#                           matches the home's partition-id) for
#                           `flower-supernode --auth-supernode-private-key`: an ECDSA P-384
#                           key in OpenSSH format, the only format Flower 1.41 reads.
#   supernode-I.pub         its public key (OpenSSH format, "ecdsa-sha2-nistp384 ..."), what
#                           `flwr supernode register` takes to allow that SuperNode in.
# Private keys are mode 600. Existing files are kept: running the script again with a
# larger N adds keys for new homes under the same CA and server certificate.
#
# X.509 with `openssl`; the SuperNode keys with the `cryptography` package that Flower
# itself depends on (openssl cannot write the OpenSSH key format Flower expects), run by
# $PYTHON (default: the project's .venv/bin/python, else python3).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

out_dir="" supernodes="" hosts="" days=365
while [ $# -gt 0 ]; do
    case "$1" in
        --supernodes) supernodes="${2:?--supernodes needs a number}"; shift 2 ;;
        --hosts) hosts="${hosts:+$hosts,}${2:?--hosts needs names or addresses}"; shift 2 ;;
        --days) days="${2:?--days needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "gen_certs.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [ -z "$out_dir" ] || { echo "gen_certs.sh: one OUT_DIR only" >&2; exit 2; }; out_dir="$1"; shift ;;
    esac
done
[ -n "$out_dir" ] || { echo "gen_certs.sh: OUT_DIR missing" >&2; usage >&2; exit 2; }
[[ "$supernodes" =~ ^[0-9]+$ ]] || { echo "gen_certs.sh: --supernodes N (a number) is required" >&2; exit 2; }
[[ "$days" =~ ^[1-9][0-9]*$ ]] || { echo "gen_certs.sh: --days must be a positive number" >&2; exit 2; }
command -v openssl >/dev/null || { echo "gen_certs.sh: openssl not found (apt-get install openssl)" >&2; exit 1; }

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
"$python" -c "import cryptography" 2>/dev/null \
    || { echo "gen_certs.sh: $python cannot import cryptography (install flwr, which brings it)" >&2; exit 1; }

mkdir -p "$out_dir"
# Everything created from here on is private to its owner unless chmod'ed otherwise.
umask 077
cd "$out_dir"

# The server certificate's subjectAltName: clients check the name or IP they dial
# against it (the SuperLink's own ServerApp process dials 127.0.0.1).
san="DNS:localhost,IP:127.0.0.1,IP:::1"
IFS=',' read -r -a extra_hosts <<<"$hosts"
for host in "${extra_hosts[@]}"; do
    [ -n "$host" ] || continue
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
done

if [ ! -f ca.crt ]; then
    openssl ecparam -name secp384r1 -genkey -noout -out ca.key
    openssl req -x509 -new -key ca.key -sha384 -days "$days" -subj "/CN=Eco-FL deployment CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out ca.crt 2>/dev/null
    echo "CA: $out_dir/ca.crt"
fi

if [ ! -f server.crt ]; then
    [ -f ca.key ] || { echo "gen_certs.sh: ca.key missing; cannot sign a server certificate" >&2; exit 1; }
    openssl ecparam -name secp384r1 -genkey -noout -out server.key
    openssl req -new -key server.key -subj "/CN=Eco-FL SuperLink" -out server.csr 2>/dev/null
    printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha384 -days "$days" \
        -extfile server.ext -out server.crt 2>/dev/null
    rm -f server.csr server.ext ca.srl
    echo "SuperLink certificate: $out_dir/server.crt ($san)"
fi

# SuperNode key pairs: missing ones only.
"$python" - "$supernodes" <<'EOF'
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

for index in range(int(sys.argv[1])):
    private_path, public_path = Path(f"supernode-{index}.key"), Path(f"supernode-{index}.pub")
    if private_path.exists() and public_path.exists():
        continue
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    public_path.write_bytes(public + f" supernode-{index}\n".encode())
    public_path.chmod(0o644)
EOF

chmod 600 ./*.key 2>/dev/null || true
chmod 644 ca.crt server.crt ./*.pub 2>/dev/null || true
echo "SuperNode keys: $supernodes in $out_dir (supernode-I.key private, supernode-I.pub to register)"
