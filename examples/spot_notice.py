"""Tell a tidal server that this spot machine is about to be taken.

Run it on each spot or preemptible machine, beside its workers. It polls the cloud's
instance metadata endpoint (from inside the instance; nothing is installed) and, on a
preemption notice, calls the server's notice hook once: ``POST
/cluster/hosts/{host}/notice`` with the time the machine goes, through
``Client.preemption_notice``. The server drains the host: every job on it moves off at
its next step boundary, and a job that cannot leave in place checkpoints first.

    python examples/spot_notice.py --cloud aws --host node-3 --url http://ctl:8080 --token T

What each cloud says, and how much notice it gives:

* AWS: ``GET http://169.254.169.254/latest/meta-data/spot/instance-action`` (IMDSv2:
  a session token first) answers 404 until the instance is marked, then
  ``{"action": "terminate", "time": "2026-11-27T14:02:00Z"}``: two minutes ahead.
* GCP: ``GET http://metadata.google.internal/computeMetadata/v1/instance/preempted``
  (header ``Metadata-Flavor: Google``) turns ``TRUE`` about 30 s before a spot VM stops.
* Azure: ``GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01``
  (header ``Metadata: true``) lists a ``Preempt`` event with its ``NotBefore`` time, at
  least 30 s ahead.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import urllib.error
import urllib.request
from datetime import datetime
from email.utils import parsedate_to_datetime

from tidal.client import Client

log = logging.getLogger("spot_notice")

#: Seconds between two looks at the metadata endpoint: well inside the shortest notice.
POLL = 5.0
#: GCP says only that the VM is preempted, not when it goes: about this long after.
GCP_NOTICE = 30.0


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def aws_notice() -> float | None:
    """When AWS takes this spot instance, if it said so."""
    _, token = _get(
        "http://169.254.169.254/latest/api/token",
        {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        method="PUT",
    )
    status, body = _get(
        "http://169.254.169.254/latest/meta-data/spot/instance-action",
        {"X-aws-ec2-metadata-token": token},
    )
    if status != 200:
        return None
    when = json.loads(body)["time"].replace("Z", "+00:00")
    return datetime.fromisoformat(when).timestamp()


def gcp_notice() -> float | None:
    """When GCP stops this spot VM, if it is being preempted (about 30 s from now)."""
    status, body = _get(
        "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
        {"Metadata-Flavor": "Google"},
    )
    return time.time() + GCP_NOTICE if status == 200 and body.strip() == "TRUE" else None


def azure_notice() -> float | None:
    """When Azure preempts this spot VM, if a ``Preempt`` event is scheduled."""
    status, body = _get(
        "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
        {"Metadata": "true"},
    )
    if status != 200:
        return None
    for event in json.loads(body).get("Events", []):
        if event.get("EventType") == "Preempt":
            not_before = event.get("NotBefore")
            return parsedate_to_datetime(not_before).timestamp() if not_before else time.time()
    return None


NOTICES = {"aws": aws_notice, "gcp": gcp_notice, "azure": azure_notice}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cloud", choices=sorted(NOTICES), required=True)
    parser.add_argument("--host", required=True, help="this machine's name in `tidal cluster`")
    parser.add_argument("--url", default=None, help="the server (else $TIDAL_URL)")
    parser.add_argument("--token", default=None, help="its token (else $TIDAL_TOKEN)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    notice = NOTICES[args.cloud]
    with Client(url=args.url, token=args.token) as client:
        while True:
            try:
                at = notice()
            except (OSError, ValueError) as exc:
                log.warning("metadata endpoint: %s", exc)
                at = None
            if at is not None:
                view = client.preemption_notice(args.host, at)
                left = view.draining.remaining if view.draining else []
                log.info("%s goes at %s; moving off it: %s", args.host, at, left or "nothing")
                return
            time.sleep(POLL)


if __name__ == "__main__":
    main()
