#!/usr/bin/env python3
"""A loopback Kubernetes API server for the operator's controller test.

Built on PyPI `kmock`: its `KubernetesScaffold` gives the HTTP server, the parsing of
Kubernetes URLs into (group, version, plural, namespace, name, subresource), the
discovery endpoints (`/api`, `/apis`, `/apis/<group>/<version>`, answering 404 for
groups nobody declared, which is how the operator learns that cert-manager is absent)
and `Status` error bodies. The object store of kmock's own `KubernetesEmulator` is
not used: it merges dicts and nothing more, while kube-rs needs what a real apiserver
does and the emulator leaves out, so this file replaces it with a small store that has:

- `metadata.uid`, `creationTimestamp`, `resourceVersion` (one global counter) and
  `generation` (bumped only when something outside `status`/`metadata` changes);
- server-side apply (`PATCH` with `application/apply-patch+yaml`, `fieldManager`,
  `force`): creates a missing object, else replaces what the (single) applier owns;
  on the `status` subresource only `status` changes, and top-level status keys the
  applier did not send stay (another manager's `lastStress`);
- JSON merge patch (RFC 7386; strategic merge is treated the same), used by the
  event recorder and by the test to play the kubelet/job controller;
- `PUT` (replace) with an optimistic-concurrency check on `resourceVersion` (409 on a
  stale write), which leader election relies on;
- lists with `metadata.resourceVersion` and label selectors (`=`, `==`, `!=`, `key`,
  `!key`), 404 `Status` bodies for missing objects, 409 on duplicate creates;
- watches that start after the requested `resourceVersion` (from a retained event
  log), filter by namespace and labels, send BOOKMARK events and end after
  `timeoutSeconds` like the real server;
- background garbage collection: deleting an object deletes the objects whose
  ownerReferences name its uid, as the cluster's garbage collector would.

Written against kmock 0.8 (scripts/test.sh pins the series): besides its public API it
overrides the private `KubernetesScaffold._handle` and trims `_requests` (see there).

Usage: `python3 kube_api_mock.py` prints `PORT <n>` once listening on 127.0.0.1 and
serves until its stdin closes (the test keeps the pipe open, so the server dies with
the test process even if the test is killed). `POST /mock/optional-crds` installs
cert-manager's Certificate and Prometheus operator's ServiceMonitor CRDs while running
(served and listed in discovery from then on).
"""

import asyncio
import copy
import datetime
import json
import os
import sys
import uuid

import kmock

# Resources the operator reads and writes, with their kinds (for discovery and lists).
RESOURCES = {
    ('', 'v1', 'configmaps'): 'ConfigMap',
    ('', 'v1', 'secrets'): 'Secret',
    ('', 'v1', 'services'): 'Service',
    ('', 'v1', 'serviceaccounts'): 'ServiceAccount',
    ('', 'v1', 'events'): 'Event',
    ('apps', 'v1', 'deployments'): 'Deployment',
    ('batch', 'v1', 'jobs'): 'Job',
    ('batch', 'v1', 'cronjobs'): 'CronJob',
    ('autoscaling', 'v2', 'horizontalpodautoscalers'): 'HorizontalPodAutoscaler',
    ('policy', 'v1', 'poddisruptionbudgets'): 'PodDisruptionBudget',
    ('networking.k8s.io', 'v1', 'networkpolicies'): 'NetworkPolicy',
    ('rbac.authorization.k8s.io', 'v1', 'roles'): 'Role',
    ('rbac.authorization.k8s.io', 'v1', 'rolebindings'): 'RoleBinding',
    ('coordination.k8s.io', 'v1', 'leases'): 'Lease',
    ('events.k8s.io', 'v1', 'events'): 'Event',
    ('mailcluster.dev', 'v1alpha1', 'mailclusters'): 'MailCluster',
}
# CRDs of other projects the operator uses when installed; see `POST /mock/optional-crds`.
OPTIONAL = {
    ('cert-manager.io', 'v1', 'certificates'): 'Certificate',
    ('monitoring.coreos.com', 'v1', 'servicemonitors'): 'ServiceMonitor',
}
# Kinds whose objects have a status subresource: writes to the main resource keep status.
WITH_STATUS = {'deployments', 'jobs', 'cronjobs', 'horizontalpodautoscalers',
               'poddisruptionbudgets', 'mailclusters', 'services'}
# How many events a watch may resume from; older resourceVersions get 410 Gone.
EVENT_LOG = 10000
BOOKMARK_EVERY = 1.0
# Requests kmock keeps on record (see ApiServer._handle); more than are ever in flight.
HISTORY = 200
# KUBE_MOCK_TRACE=1 logs every object request to stderr (debugging a failing test).
TRACE = bool(os.environ.get('KUBE_MOCK_TRACE'))


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def selector_matches(obj, selector: str) -> bool:
    labels = (obj.get('metadata') or {}).get('labels') or {}
    for term in filter(None, (t.strip() for t in selector.split(','))):
        if '!=' in term:
            k, v = term.split('!=', 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif '=' in term:
            k, v = term.replace('==', '=').split('=', 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith('!'):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def spec_part(obj):
    """What `generation` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ('metadata', 'status', 'apiVersion', 'kind')}


def error(status: int, reason: str, message: str, name: str = '') -> kmock.KubernetesError:
    # Non-empty details: kmock would otherwise put a Python traceback there.
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={'name': name})


class ApiServer(kmock.KubernetesScaffold):
    """kmock's scaffold with a stateful store that behaves as kube-rs expects."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = {}  # (group, version, plural, namespace, name) -> object
        self.rv = 0
        self.log = []  # (rv, key, event) of every change, newest last
        self.changed = asyncio.Condition()
        self.declare(RESOURCES)
        # Installs the optional CRDs while running (as `kubectl apply` of a CRD would).
        self.fallback['post /mock/optional-crds'] << self.install_optional_crds
        self.routes = {
            kmock.action.WATCH: self.watch,
            kmock.action.LIST: self.list,
            kmock.action.FETCH: self.fetch,
            kmock.action.CREATE: self.create,
            kmock.action.UPDATE: self.patch,
            kmock.action.DELETE: self.delete,
        }

    def declare(self, resources):
        """Makes resources known to kmock's discovery endpoints."""
        for (group, version, plural), kind in resources.items():
            gv = f'{group}/{version}' if group else version
            self.resources[f'{gv}/{plural}'] = kmock.ResourceInfo(
                kind=kind, namespaced=True, verbs={'get', 'list', 'watch', 'create', 'update',
                                                   'patch', 'delete'},
                subresources={'status'} if plural in WITH_STATUS else set())

    def install_optional_crds(self):
        RESOURCES.update(OPTIONAL)
        self.declare(OPTIONAL)
        return {'installed': sorted(OPTIONAL.values())}

    async def _handle(self, request):
        # kmock records every request for assertions, and matches each new request to
        # a reaction by filtering that whole record again: quadratic over a test's
        # thousands of requests. Nothing here asserts on old requests, so the record is
        # kept short, and object requests (nearly all of them) skip reaction matching:
        # they go straight to the store, rendered by kmock's response renderer (JSON,
        # streams, and Status bodies for the KubernetesErrors raised).
        del self._requests[:-HISTORY]
        r = request.resource
        if r is None or r.plural is None:
            return await super()._handle(request)  # discovery and /mock/ endpoints
        route = self.routes.get(request.action)
        if route is None and request.method == kmock.method.PUT and request.name:
            route = self.replace
        if route is None:
            raise error(405, 'MethodNotAllowed', f'{request.method.value} {request.url.path}')
        if TRACE:
            print(request.method.value, request.url.path_qs, file=sys.stderr, flush=True)
        return await kmock.Response(payload=route)(request)

    # ---- store ----

    def key(self, request, name=None):
        r = request.resource
        if (r.group, r.version, r.plural) not in RESOURCES:
            raise error(404, 'NotFound', f'the server could not find the requested resource {r.plural}')
        return (r.group, r.version, r.plural, request.namespace, name or request.name)

    def kind_of(self, key):
        group, version, plural = key[:3]
        return (f'{group}/{version}' if group else version), RESOURCES[(group, version, plural)]

    async def record(self, key, type_, obj):
        self.rv += 1
        obj['metadata']['resourceVersion'] = str(self.rv)
        if type_ == 'DELETED':
            self.store.pop(key, None)
        else:
            self.store[key] = obj
        self.log.append((self.rv, key, {'type': type_, 'object': copy.deepcopy(obj)}))
        del self.log[:-EVENT_LOG]
        async with self.changed:
            self.changed.notify_all()
        return copy.deepcopy(obj)

    def get(self, key):
        obj = self.store.get(key)
        if obj is None:
            raise error(404, 'NotFound', f'{key[2]} "{key[4]}" not found', key[4])
        return obj

    def stamp_new(self, key, obj):
        apiv, kind = self.kind_of(key)
        obj.setdefault('apiVersion', apiv)
        obj.setdefault('kind', kind)
        meta = obj.setdefault('metadata', {})
        meta['name'] = key[4]
        if key[3] is not None:
            meta['namespace'] = key[3]
        meta['uid'] = str(uuid.uuid4())
        meta['creationTimestamp'] = now()
        meta['generation'] = 1
        meta.pop('resourceVersion', None)
        return obj

    def carry_server_fields(self, old, new, keep_status):
        """Fields the server owns survive writes; generation moves with the spec."""
        meta = new.setdefault('metadata', {})
        for f in ('name', 'namespace', 'uid', 'creationTimestamp', 'resourceVersion'):
            if f in old['metadata']:
                meta[f] = old['metadata'][f]
        generation = old['metadata'].get('generation', 1)
        meta['generation'] = generation + (1 if spec_part(old) != spec_part(new) else 0)
        if keep_status:
            if 'status' in old:
                new['status'] = old['status']
            else:
                new.pop('status', None)
        return new

    # ---- verbs ----

    async def fetch(self, request):
        return copy.deepcopy(self.get(self.key(request)))

    async def list(self, request):
        key = self.key(request, name='')
        sel = request.params.get('labelSelector', '')
        items = [copy.deepcopy(o) for k, o in sorted(self.store.items())
                 if k[:3] == key[:3] and (key[3] is None or k[3] == key[3]) and selector_matches(o, sel)]
        apiv, kind = self.kind_of(key)
        return {'apiVersion': apiv, 'kind': f'{kind}List',
                'metadata': {'resourceVersion': str(self.rv)}, 'items': items}

    async def create(self, request):
        meta = request.data.setdefault('metadata', {})
        if not meta.get('name') and meta.get('generateName'):
            meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
        name = meta.get('name')
        if not name:
            raise error(422, 'Invalid', 'metadata.name is required')
        key = self.key(request, name=name)
        if key in self.store:
            raise error(409, 'AlreadyExists', f'{key[2]} "{name}" already exists')
        return kmock.Response(status=201, payload=await self.record(
            key, 'ADDED', self.stamp_new(key, copy.deepcopy(request.data))))

    async def replace(self, request):
        key = self.key(request)
        old = self.get(key)
        new = copy.deepcopy(request.data)
        sent_rv = (new.get('metadata') or {}).get('resourceVersion')
        if sent_rv and sent_rv != old['metadata']['resourceVersion']:
            raise error(409, 'Conflict', 'the object has been modified; please apply your changes '
                        'to the latest version and try again')
        if request.subresource == 'status':
            new = dict(copy.deepcopy(old), status=new.get('status'))
        else:
            self.carry_server_fields(old, new, keep_status=key[2] in WITH_STATUS)
        return await self.record(key, 'MODIFIED', new)

    async def patch(self, request):
        key = self.key(request)
        ctype = request.headers.get('Content-Type', '').split(';')[0].strip()
        body = request.data if request.data is not None else json.loads(request.body or b'null')
        status_only = request.subresource == 'status'
        old = self.store.get(key)
        if ctype == 'application/apply-patch+yaml':
            if 'fieldManager' not in request.params:
                raise error(422, 'Invalid', 'fieldManager is required for apply patch')
            if old is None:
                if status_only:
                    self.get(key)  # 404: status of a missing object
                new = self.stamp_new(key, copy.deepcopy(body))
                return await self.record(key, 'ADDED', new)
            if status_only:
                # Top-level status keys this applier did not send belong to other managers.
                new = copy.deepcopy(old)
                new['status'] = dict(old.get('status') or {}, **(body.get('status') or {}))
            else:
                new = copy.deepcopy(body)
                self.carry_server_fields(old, new, keep_status=key[2] in WITH_STATUS)
                meta = new['metadata']
                for f in ('ownerReferences', 'labels', 'annotations'):
                    if f not in meta and f in old['metadata']:
                        meta[f] = old['metadata'][f]
        elif ctype in ('application/merge-patch+json', 'application/strategic-merge-patch+json'):
            old = self.get(key)
            if status_only:
                new = dict(copy.deepcopy(old), status=merge_patch(old.get('status'), body.get('status')))
            else:
                new = merge_patch(old, body)
                self.carry_server_fields(old, new, keep_status=key[2] in WITH_STATUS)
        else:
            raise error(415, 'UnsupportedMediaType', f'unsupported patch type {ctype!r}')
        if new == old:
            return copy.deepcopy(old)  # a no-op write changes no resourceVersion, like the apiserver
        return await self.record(key, 'MODIFIED', new)

    async def delete(self, request):
        key = self.key(request)
        obj = copy.deepcopy(self.get(key))
        gone = await self.record(key, 'DELETED', obj)
        await self.collect_garbage(obj['metadata']['uid'])
        return gone

    async def collect_garbage(self, uid):
        owned = [k for k, o in self.store.items()
                 if any(r.get('uid') == uid for r in (o['metadata'].get('ownerReferences') or []))]
        for k in owned:
            if k in self.store:
                obj = copy.deepcopy(self.store[k])
                await self.record(k, 'DELETED', obj)
                await self.collect_garbage(obj['metadata']['uid'])

    async def watch(self, request):
        key = self.key(request, name='')
        sel = request.params.get('labelSelector', '')
        timeout = min(float(request.params.get('timeoutSeconds', 290)), 290.0)
        since = request.params.get('resourceVersion', '')
        bookmarks = request.params.get('allowWatchBookmarks') == 'true'
        deadline = asyncio.get_running_loop().time() + timeout
        apiv, kind = self.kind_of(key)

        def wanted(k, ev):
            return (k[:3] == key[:3] and (key[3] is None or k[3] == key[3])
                    and (request.name is None or k[4] == request.name)
                    and selector_matches(ev['object'], sel))

        async def events():
            yield b''  # send the headers now: the client waits for them before streaming
            if since in ('', '0'):
                # "Any" resourceVersion: the current state as ADDED events, then changes.
                last = self.rv
                for k, o in sorted(self.store.items()):
                    ev = {'type': 'ADDED', 'object': copy.deepcopy(o)}
                    if wanted(k, ev):
                        yield ev
            else:
                last = int(since)
                if self.log and last < self.log[0][0] - 1 and last < self.rv:
                    yield {'type': 'ERROR', 'object': {
                        'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                        'message': f'too old resource version: {last}', 'reason': 'Expired',
                        'code': 410}}
                    return
            while True:
                for rv, k, ev in [e for e in self.log if e[0] > last]:
                    last = rv
                    if wanted(k, ev):
                        yield ev
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                try:
                    async with self.changed:
                        await asyncio.wait_for(self.changed.wait(), min(remaining, BOOKMARK_EVERY))
                except TimeoutError:
                    if bookmarks:
                        yield {'type': 'BOOKMARK', 'object': {
                            'apiVersion': apiv, 'kind': kind,
                            'metadata': {'resourceVersion': str(last)}}}
        return events()


async def main() -> None:
    async with ApiServer() as handler, kmock.Server(handler) as server:
        print(f'PORT {server.port}', flush=True)
        # Serve until the parent closes our stdin (or dies).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == '__main__':
    asyncio.run(main())
