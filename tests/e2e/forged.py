#!/usr/bin/env python3
"""Sends forged pod DELETE AdmissionReviews straight to a webhook's admission port.

usage: forged.py URL CA_FILE COUNT FIXTURE

Each review names a pod that does not exist (`forged-N/ghost-N`, its own namespace), as the
ReplicaSet controller, running on a node: what the built-in policy's controller-deletes
rule paces. One keep-alive TLS connection, a 10 s timeout per request, COUNT requests at
most. Prints `forged: sent N, allowed A, refused R (429), other O in S s` and exits non-zero
if any request failed outright.
"""
import copy
import http.client
import json
import ssl
import sys
import time
import urllib.parse


def main() -> int:
    url, ca_file, count, fixture = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    parsed = urllib.parse.urlsplit(url)
    context = ssl.create_default_context(cafile=ca_file)
    with open(fixture, encoding="utf-8") as f:
        template = json.load(f)
    connection = None
    allowed = refused = other = 0
    started = time.monotonic()
    for i in range(count):
        review = copy.deepcopy(template)
        request = review["request"]
        namespace, name = f"forged-{i}", f"ghost-{i}"
        request["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        request["namespace"] = namespace
        request["name"] = name
        old = request["oldObject"]["metadata"]
        old["namespace"], old["name"] = namespace, name
        old["uid"] = f"11111111-0000-0000-0000-{i:012d}"
        body = json.dumps(review).encode()
        for attempt in range(2):
            if connection is None:
                connection = http.client.HTTPSConnection(
                    parsed.hostname, parsed.port, context=context, timeout=10
                )
            try:
                connection.request(
                    "POST", parsed.path, body, {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                text = response.read()
                break
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                connection = None
                if attempt == 1:
                    print(f"forged: request {i} failed: {e}", file=sys.stderr)
                    return 1
        if response.status != 200:
            print(f"forged: request {i}: HTTP {response.status}: {text[:200]!r}", file=sys.stderr)
            return 1
        answer = json.loads(text)["response"]
        if answer.get("allowed"):
            allowed += 1
        elif answer.get("status", {}).get("code") == 429:
            refused += 1
        else:
            other += 1
    if connection is not None:
        connection.close()
    elapsed = time.monotonic() - started
    print(
        f"forged: sent {count}, allowed {allowed}, refused {refused} (429), "
        f"other {other} in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
