// The proxy of Anthropic's sandbox runtime (@anthropic-ai/sandbox-runtime) for table 7 of
// docs/benchmarks.md, started from the package's own modules (bench/srt.py explains why and how).
//
//   node bench/srt_proxy.mjs serve   <config JSON on argv[3]>   prints one JSON line when listening
//   node bench/srt_proxy.mjs mint    <config JSON on argv[3]>   prints leaf mint timings as JSON
//
// config: {"package": dir of the installed package, "allowed": [host patterns],
//          "resolve": {name: address}, "tunnel": [host patterns never terminated],
//          "inject_host": name, "secret": the real credential}
// `serve` first tries the package's public entry point, SandboxManager.initialize(), and reports
// why it refused ("manager_error"); then it wires the same pieces SandboxManager wires in
// startMuxProxyServer: createHttpProxyServer (CONNECT, allowlist filter, Proxy-Authorization),
// TLS termination with an ephemeral MITM CA (createMitmCA), header credential injection through
// the package's SentinelRegistry, behind createMuxProxyServer (the single HTTP+SOCKS port).
import { randomBytes } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';

const [, , command, raw] = process.argv;
const config = JSON.parse(raw);
const load = rel => import(pathToFileURL(join(config.package, 'dist', rel)).href);

const { createMitmCA } = await load('sandbox/mitm-ca.js');
const { matchesDomainPattern } = await load('sandbox/domain-pattern.js');

if (command === 'mint') {
  const { mintLeafCert } = await load('sandbox/mitm-leaf.js');
  const ca = createMitmCA({});
  const fresh = [];
  for (let i = 0; i < (config.count ?? 5); i++) {
    const t = process.hrtime.bigint();
    mintLeafCert(ca, `host${i}.mint.bench.valetkey.test`);
    fresh.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  const cached = [];
  for (let i = 0; i < 1000; i++) {
    const t = process.hrtime.bigint();
    mintLeafCert(ca, 'host0.mint.bench.valetkey.test');
    cached.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  console.log(JSON.stringify({ fresh_ms: fresh, cached_ms: cached, key: 'RSA 2048 (node-forge keygen)' }));
  process.exit(0);
}

let managerError = '';
try {
  const { SandboxManager } = await load('index.js');
  await SandboxManager.initialize({
    network: { allowedDomains: config.allowed, deniedDomains: [] },
    filesystem: { denyRead: [], allowWrite: [], denyWrite: [] },
  });
  managerError = 'none: SandboxManager.initialize() succeeded (its proxy was not used, for a like-for-like setup)';
  await SandboxManager.reset();
} catch (err) {
  managerError = String(err?.message ?? err);
}

const { createHttpProxyServer } = await load('sandbox/http-proxy.js');
const { createMuxProxyServer } = await load('sandbox/mux-proxy.js');
const { SentinelRegistry } = await load('sandbox/credential-sentinel.js');

const allowed = (host) => config.allowed.some(p => matchesDomainPattern(host, p));
const lookup = () => (hostname, options, callback) => {
  const address = config.resolve[hostname];
  if (!address) {
    callback(Object.assign(new Error(`bench: ${hostname} is not in the resolver map`), { code: 'ENOTFOUND' }));
  } else if (options?.all) {
    callback(null, [{ address, family: 4 }]);
  } else {
    callback(null, address, 4);
  }
};
const registry = new SentinelRegistry();
const sentinel = registry.register('BENCH_TOKEN', config.secret, [config.inject_host]);
const proxyAuthToken = randomBytes(16).toString('hex');
const mitmCA = createMitmCA({});
const httpServer = createHttpProxyServer({
  filter: async (port, host) => allowed(host),
  mitmCA,
  shouldTerminateTLS: host => !config.tunnel.some(p => matchesDomainPattern(host, p)),
  mutateHeaders: (headers, destHost) => registry.substituteInHeaders(headers, destHost, matchesDomainPattern),
  getBodySubstitutions: destHost => registry.sentinelsForHost(destHost, matchesDomainPattern),
  lookupFor: lookup,
  proxyAuthToken,
});
const mux = createMuxProxyServer({
  httpServer,
  handleSocksConnection: socket => socket.destroy(),
});
await mux.listenHttpBackend();
await new Promise(resolve => mux.server.listen(0, '127.0.0.1', resolve));
console.log(JSON.stringify({
  port: mux.getPort(), ca: mitmCA.certPath, sentinel, proxy_auth: proxyAuthToken,
  manager_error: managerError, node: process.version,
}));
process.on('SIGTERM', () => process.exit(0));
