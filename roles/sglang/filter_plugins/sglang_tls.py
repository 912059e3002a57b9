"""Filter of role sglang: what is wrong with the TLS certificate given to the instances and the router.

    {{ cert_pem | sglang_tls_problems(ca_pem, ['10.0.0.5', '127.0.0.1']) }}  ->  [] or ['...', ...]

Read on the controller before anything changes, so a certificate the clients would refuse stops the play
with the reason instead of a unit that never becomes ready. It checks what the clients check:

- every address in `names` is in the certificate's subjectAltName: an IP address as an iPAddress entry, a
  name as a dNSName entry (a leading `*.` matches one label). Python's ssl module (SGLang's own health and
  warm-up requests, the readiness probes, the generator) and the router's TLS client match the host they
  connect to against subjectAltName only, never the subject's CN (Python's ssl module, "Hostname matching":
  the subject CN is not checked once subjectAltName is present, and since Python 3.7 OpenSSL's own matcher
  ignores the CN, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
- it is valid now (notBefore/notAfter);
- it chains to the CA: each certificate in the file is signed by the next one, the last by the CA (or is
  the CA).

The private key is not read here: it stays out of the controller's templating (the copy decrypts it).
Uses `cryptography`, which ansible-core itself requires on the controller.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
from typing import Any

try:  # Ansible shows an AnsibleFilterError's message as is; tests load this file without Ansible too
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover
    _Base = ValueError  # type: ignore[misc,assignment]


class SglangTlsError(_Base):
    pass


def _load(pem: str, what: str) -> list[Any]:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        certs = []
    if not certs:
        raise SglangTlsError(f"{what} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return certs


def _names(cert: Any) -> tuple[set[str], set[Any]]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return ({n.lower() for n in san.get_values_for_type(x509.DNSName)},
            set(san.get_values_for_type(x509.IPAddress)))


def _matches(name: str, dns: set[str], ips: set[Any]) -> bool:
    try:
        return ipaddress.ip_address(name) in ips
    except ValueError:
        pass
    name = name.lower().rstrip(".")
    if name in dns:
        return True
    head, _, rest = name.partition(".")
    return bool(head and rest) and f"*.{rest}" in dns


def _signed_by(cert: Any, issuer: Any) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except Exception:  # InvalidSignature (not a ValueError), or a key type that cannot sign
        return False
    return True


def _when(cert: Any, field: str) -> datetime.datetime:
    value = getattr(cert, f"{field}_utc", None)  # cryptography >= 42
    if value is None:
        value = getattr(cert, field).replace(tzinfo=datetime.UTC)
    return value


def sglang_tls_problems(cert_pem: str, ca_pem: str, names: list[str]) -> list[str]:
    """The reasons the certificate would be refused for these addresses; [] when there is none."""
    chain = _load(cert_pem, "sglang_tls_cert_src")
    ca = _load(ca_pem, "sglang_tls_ca_src")[0]
    leaf = chain[0]
    problems = []
    dns, ips = _names(leaf)
    missing = [n for n in names if not _matches(str(n), dns, ips)]
    if missing:
        have = sorted(dns) + sorted(str(i) for i in ips)
        problems.append(
            f"sglang_tls_cert_src does not name {', '.join(missing)} in its subjectAltName (it names "
            f"{', '.join(have) or 'nothing'}); clients verify the address they connect to against it"
        )
    now = datetime.datetime.now(datetime.UTC)
    for cert in chain:
        who = f"a certificate in sglang_tls_cert_src ({cert.subject.rfc4514_string()})"
        if _when(cert, "not_valid_after") < now:
            problems.append(f"{who} expired on {_when(cert, 'not_valid_after'):%Y-%m-%d %H:%M} UTC")
        elif _when(cert, "not_valid_before") > now:
            problems.append(f"{who} is not valid before {_when(cert, 'not_valid_before'):%Y-%m-%d %H:%M} UTC")
    for cert, issuer in itertools.pairwise(chain):
        if not _signed_by(cert, issuer):
            problems.append(f"sglang_tls_cert_src: {cert.subject.rfc4514_string()} is not signed by the next "
                            f"certificate in the file ({issuer.subject.rfc4514_string()})")
    last = chain[-1]
    if last != ca and not _signed_by(last, ca):
        problems.append(f"sglang_tls_cert_src ({last.subject.rfc4514_string()}) is not signed by the CA in "
                        f"sglang_tls_ca_src ({ca.subject.rfc4514_string()})")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sglang_tls_problems": sglang_tls_problems}
