/**
 * The deployment kit cannot be silently broken: every YAML file of the repository parses
 * strictly (no duplicate keys, no unintended extra documents: the seed's Kubernetes manifest
 * whose second half was a pasted copy of the first fails here), the manifests have the kinds
 * and cross-references they should, their flags, port and probe paths are the ones the example
 * server really accepts and serves, and the Dockerfile builds and runs the same entry point as
 * `npm start`. There is no Docker daemon in CI, so the Dockerfile is interpreted here: its build
 * stage is run (the compile) on exactly the files its context and COPY lines give it, and its
 * ENTRYPOINT and CMD are started with node.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import http from 'node:http';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway, type RunningGateway } from '../../example-server/gateway';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { findExecutable, freePort, REPO, waitFor } from '../helpers';

// --- the repository's files and YAML ---------------------------------------------------------

/** Tracked and new (not ignored) files, as the repository will hold them. */
function repositoryFiles(): string[] {
  return execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: REPO, encoding: 'utf8' })
    .split('\0')
    .filter((file) => file !== '' && existsSync(path.join(REPO, file)));
}

const K8S = 'example-server/k8s';
/** Every manifest, and the [apiVersion, kind] of each of its documents, in order. */
const MANIFESTS: Record<string, Array<[string, string]>> = {
  [`${K8S}/kustomization.yaml`]: [['kustomize.config.k8s.io/v1beta1', 'Kustomization']],
  [`${K8S}/gateway-deployment.yaml`]: [['apps/v1', 'Deployment']],
  [`${K8S}/gateway-service.yaml`]: [['v1', 'Service']],
  [`${K8S}/gateway-podmonitor.yaml`]: [['monitoring.coreos.com/v1', 'PodMonitor']],
  [`${K8S}/gateway-peers-service.yaml`]: [['v1', 'Service']],
  [`${K8S}/vllm-headless-service.yaml`]: [['v1', 'Service']],
  [`${K8S}/vllm-example.yaml`]: [
    ['apps/v1', 'Deployment'],
    ['v1', 'Service'],
  ],
  // Prefill/decode disaggregation, checked further in __tests__/disaggregation/deploy.test.ts.
  [`${K8S}/disaggregated/kustomization.yaml`]: [['kustomize.config.k8s.io/v1beta1', 'Kustomization']],
  [`${K8S}/disaggregated/vllm-prefill.yaml`]: [
    ['apps/v1', 'Deployment'],
    ['v1', 'Service'],
  ],
  [`${K8S}/disaggregated/vllm-decode.yaml`]: [
    ['apps/v1', 'Deployment'],
    ['v1', 'Service'],
  ],
  [`${K8S}/disaggregated/gateway-pd.yaml`]: [
    ['apps/v1', 'Deployment'],
    ['v1', 'Service'],
  ],
};

/**
 * Why a YAML text is not what was meant; empty when fine. Duplicate keys, any parser error or
 * warning, a document count other than `expectedDocuments`, an empty document, and content that
 * means something else in YAML 1.1 (what Kubernetes' and Prometheus' Go parsers speak: `on`,
 * `yes`, `0755`, `1:30`) than in YAML 1.2.
 */
function yamlProblems(text: string, expectedDocuments = 1): string[] {
  const problems: string[] = [];
  const documents = parseAllDocuments(text, { uniqueKeys: true, prettyErrors: true });
  const list = [...documents]; // an empty stream is an empty array
  for (const document of list) {
    problems.push(...document.errors.map((error) => error.message), ...document.warnings.map((warning) => warning.message));
  }
  if (list.length !== expectedDocuments) problems.push(`has ${list.length} documents, expected ${expectedDocuments}`);
  if (problems.length > 0) return problems;
  for (const [index, document] of list.entries()) {
    if (document.toJS() === null || document.toJS() === undefined) problems.push(`document ${index + 1} is empty`);
  }
  const asYaml11 = parseAllDocuments(text, { version: '1.1' });
  const meaning11 = asYaml11.map((document) => document.toJS());
  if (!isDeepStrictEqual(meaning11, list.map((document) => document.toJS()))) {
    problems.push('means something else in YAML 1.1 (Kubernetes, Prometheus): quote values like on, yes, 0755, 1:30');
  }
  return problems;
}

/** The documents of a manifest as plain objects. */
function manifest(file: string): any[] {
  return parseAllDocuments(readFileSync(path.join(REPO, file), 'utf8')).map((document) => document.toJS());
}

function byKind(file: string, kind: string): any {
  const found = manifest(file).filter((document) => document.kind === kind);
  expect(found).toHaveLength(1);
  return found[0];
}

const gatewayDeployment = () => byKind(`${K8S}/gateway-deployment.yaml`, 'Deployment');
const gatewayService = () => byKind(`${K8S}/gateway-service.yaml`, 'Service');
const vllmDeployment = () => byKind(`${K8S}/vllm-example.yaml`, 'Deployment');
const vllmService = () => byKind(`${K8S}/vllm-example.yaml`, 'Service');
const vllmPodsService = () => byKind(`${K8S}/vllm-headless-service.yaml`, 'Service');

function container(deployment: any, name: string): any {
  const found = deployment.spec.template.spec.containers.find((candidate: { name: string }) => candidate.name === name);
  if (!found) throw new Error(`${deployment.metadata.name} has no container ${name}`);
  return found;
}

const gatewayContainer = () => container(gatewayDeployment(), 'gateway');

/** A container port, by the name or number a probe or Service uses. */
function containerPort(spec: any, port: string | number): number {
  const found = spec.ports.find((candidate: { name?: string; containerPort: number }) => candidate.name === port || candidate.containerPort === port);
  if (!found) throw new Error(`container ${spec.name} has no port ${port}`);
  return found.containerPort;
}

function selects(selector: Record<string, string>, labels: Record<string, string>): boolean {
  return Object.keys(selector).length > 0 && Object.entries(selector).every(([key, value]) => labels[key] === value);
}

/** The settings the manifest's container args and env give the example server. */
function manifestSettings(spec: any): GatewaySettings {
  const env = Object.fromEntries((spec.env ?? []).map((variable: { name: string; value: string }) => [variable.name, variable.value]));
  const settings = parseCommandLine(spec.args ?? [], env);
  if (settings === 'help') throw new Error('the container args ask for --help');
  return settings;
}

/** The manifest's upstream (found by DNS in a cluster) as one server at `url`. */
function atUrl(upstream: GatewaySettings['upstreams'][number], url: string): GatewaySettings['upstreams'][number] {
  const { dns: _dns, ...rest } = upstream as { dns?: unknown };
  return { ...(rest as object), url };
}

/** `--flag=value` or `--flag value` from an argument list. */
function flagValue(args: readonly string[], flag: string): string | undefined {
  for (const [index, arg] of args.entries()) {
    if (arg === flag) return args[index + 1];
    if (arg.startsWith(`${flag}=`)) return arg.slice(flag.length + 1);
  }
  return undefined;
}

// --- the Dockerfile ----------------------------------------------------------------------

interface Instruction {
  keyword: string;
  args: string;
}
interface Stage {
  name: string;
  base: string;
  instructions: Instruction[];
}

const DOCKERFILE = 'example-server/Dockerfile';
/** BuildKit reads `<Dockerfile>.dockerignore` next to the Dockerfile before the context root's. */
const DOCKERIGNORE = 'example-server/Dockerfile.dockerignore';

/** Instructions by stage: continuation lines joined, comment lines dropped, ARG defaults substituted in FROM. */
function readDockerfile(): Stage[] {
  const lines = readFileSync(path.join(REPO, DOCKERFILE), 'utf8').split('\n');
  const instructions: Instruction[] = [];
  let pending = '';
  for (const line of lines) {
    if (/^\s*#/.test(line)) continue;
    if (line.endsWith('\\')) {
      pending += line.slice(0, -1);
      continue;
    }
    const whole = (pending + line).trim();
    pending = '';
    if (whole === '') continue;
    const match = /^([A-Za-z]+)\s+([\s\S]*)$/.exec(whole);
    if (!match) throw new Error(`cannot read Dockerfile line ${whole}`);
    instructions.push({ keyword: match[1].toUpperCase(), args: match[2].trim() });
  }
  const globalArgs = new Map<string, string>();
  const stages: Stage[] = [];
  for (const instruction of instructions) {
    if (instruction.keyword === 'ARG' && stages.length === 0) {
      const [name, value = ''] = instruction.args.split(/=(.*)/s);
      globalArgs.set(name, value);
    } else if (instruction.keyword === 'FROM') {
      const [base, as, name] = instruction.args.replace(/\$\{?(\w+)\}?/g, (_, arg: string) => globalArgs.get(arg) ?? '').split(/\s+/);
      stages.push({ base, name: as?.toUpperCase() === 'AS' ? name : String(stages.length), instructions: [] });
    } else {
      if (stages.length === 0) throw new Error(`${instruction.keyword} before FROM`);
      stages[stages.length - 1].instructions.push(instruction);
    }
  }
  return stages;
}

function execForm(instruction: Instruction | undefined): string[] {
  if (!instruction) throw new Error('missing instruction');
  const parsed: unknown = JSON.parse(instruction.args);
  if (!Array.isArray(parsed) || !parsed.every((part) => typeof part === 'string')) throw new Error(`${instruction.keyword} is not an exec-form JSON array`);
  return parsed;
}

function last(stage: Stage, keyword: string): Instruction | undefined {
  return stage.instructions.filter((instruction) => instruction.keyword === keyword).pop();
}

function stageEnv(stage: Stage): Record<string, string> {
  const env: Record<string, string> = {};
  for (const instruction of stage.instructions.filter((candidate) => candidate.keyword === 'ENV')) {
    for (const pair of instruction.args.split(/\s+/)) {
      const [name, value] = pair.split(/=(.*)/s);
      env[name] = value;
    }
  }
  return env;
}

/** Docker's .dockerignore rules: the last matching pattern wins; a pattern matching a parent directory matches the file. */
function dockerignore(text: string): (file: string) => boolean {
  const rules = text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'))
    .map((line) => {
      const negate = line.startsWith('!');
      const pattern = path.posix.normalize((negate ? line.slice(1) : line).trim()).replace(/^\/+|\/+$/g, '');
      let regex = '';
      for (let index = 0; index < pattern.length; index++) {
        const char = pattern[index];
        if (char === '*' && pattern[index + 1] === '*') {
          index++;
          if (pattern[index + 1] === '/') {
            index++;
            regex += '(?:.*/)?';
          } else regex += '.*';
        } else if (char === '*') regex += '[^/]*';
        else if (char === '?') regex += '[^/]';
        else regex += char.replace(/[.+^${}()|[\]\\]/g, '\\$&');
      }
      return { negate, regex: new RegExp(`^${regex}$`) };
    });
  return (file) => {
    const parts = file.split('/');
    const candidates = parts.map((_, index) => parts.slice(0, index + 1).join('/'));
    let excluded = false;
    for (const rule of rules) if (candidates.some((candidate) => rule.regex.test(candidate))) excluded = !rule.negate;
    return excluded;
  };
}

/** The files `docker build -f example-server/Dockerfile .` sends from a checkout of the repository. */
function buildContext(): string[] {
  const ignored = dockerignore(readFileSync(path.join(REPO, DOCKERIGNORE), 'utf8'));
  return repositoryFiles().filter((file) => !ignored(file));
}

/** What the simulated build did and left behind. */
interface SimulatedBuild {
  root: string;
  /** Each stage's WORKDIR on disk. */
  workdirs: Map<string, string>;
  /** The `npm ci` command lines, by stage. */
  npmCi: Map<string, string[]>;
}

/**
 * Runs the Dockerfile without Docker: each stage gets a directory, COPY copies from the build
 * context (or an earlier stage), `npm ci` is stood in for by this checkout's node_modules (then
 * the package's `prepare` runs, as npm runs it, unless `--ignore-scripts`), and the other RUN
 * lines (the compile, the package.json edit) run as written. A RUN this does not know fails the
 * test, so the simulation cannot drift from the Dockerfile unnoticed.
 */
async function simulateBuild(stages: readonly Stage[], context: readonly string[]): Promise<SimulatedBuild> {
  const root = mkdtempSync(path.join(tmpdir(), 'dp-router-image-'));
  try {
    return await simulateStages(root, stages, context);
  } catch (error) {
    rmSync(root, { recursive: true, force: true });
    throw error;
  }
}

async function simulateStages(root: string, stages: readonly Stage[], context: readonly string[]): Promise<SimulatedBuild> {
  const build: SimulatedBuild = { root, workdirs: new Map(), npmCi: new Map() };
  for (const stage of stages) {
    const stageRoot = path.join(root, stage.name);
    let workdir = stageRoot;
    const inStage = (target: string) => path.join(stageRoot, path.posix.resolve(path.posix.join('/', path.relative(stageRoot, workdir)), target));
    for (const { keyword, args } of stage.instructions) {
      if (keyword === 'WORKDIR') {
        workdir = path.join(stageRoot, args);
        mkdirSync(workdir, { recursive: true });
      } else if (keyword === 'COPY') {
        const parts = args.split(/\s+/);
        const from = parts.find((part) => part.startsWith('--from='))?.slice('--from='.length);
        const sources = parts.filter((part) => !part.startsWith('--'));
        const target = sources.pop()!;
        const destination = inStage(target);
        const intoDirectory = target.endsWith('/') || sources.length > 1;
        for (const source of sources) {
          if (from) {
            const fromPath = path.join(root, from, source);
            if (!existsSync(fromPath)) throw new Error(`COPY --from=${from} ${source}: nothing there`);
            cpSync(fromPath, destination, { recursive: true });
            continue;
          }
          const clean = path.posix.normalize(source).replace(/\/+$/, '');
          const files = context.filter((file) => file === clean || file.startsWith(`${clean}/`));
          if (files.length === 0) throw new Error(`COPY ${source}: not in the build context (see ${DOCKERIGNORE})`);
          for (const file of files) {
            // A directory's contents go into the destination; a file goes into it or becomes it.
            const into = file !== clean ? path.join(destination, path.posix.relative(clean, file)) : intoDirectory ? path.join(destination, path.basename(file)) : destination;
            mkdirSync(path.dirname(into), { recursive: true });
            cpSync(path.join(REPO, file), into);
          }
        }
      } else if (keyword === 'RUN') {
        const commands = args.split(/\s*&&\s*/);
        if (/^npm ci\b/.test(commands[0])) {
          for (const command of commands) {
            if (/^npm ci\b/.test(command)) build.npmCi.set(stage.name, [...(build.npmCi.get(stage.name) ?? []), command]);
            else if (!/^npm cache clean\b/.test(command)) throw new Error(`the simulated build does not know ${JSON.stringify(command)}`);
          }
          if (!existsSync(path.join(workdir, 'node_modules'))) symlinkSync(path.join(REPO, 'node_modules'), path.join(workdir, 'node_modules'), 'dir');
          // After installing, npm ci runs the package's own `prepare` (the library's build), with what the stage has copied so far.
          const { scripts } = JSON.parse(readFileSync(path.join(workdir, 'package.json'), 'utf8')) as { scripts?: Record<string, string> };
          if (scripts?.prepare !== undefined && !commands.some((command) => /^npm ci\b.*--ignore-scripts/.test(command))) await run('npm', ['run', '--silent', 'prepare'], workdir);
        } else if (/^(npx tsc|node -e) /.test(args)) {
          await run('sh', ['-c', args], workdir);
        } else {
          throw new Error(`the simulated build does not know RUN ${args}`);
        }
      } else if (!['ENV', 'ARG', 'USER', 'EXPOSE', 'ENTRYPOINT', 'CMD', 'LABEL'].includes(keyword)) {
        throw new Error(`the simulated build does not know ${keyword}`);
      }
    }
    build.workdirs.set(stage.name, workdir);
  }
  return build;
}

function run(command: string, args: string[], cwd: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${command} ${args.join(' ')} failed (${code}):\n${output}`))));
  });
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    if (name === 'node_modules') return [];
    const full = path.join(dir, name);
    return statSync(full).isDirectory() ? filesUnder(full) : [full];
  });
}

/** The package a bare `require()` names (`@scope/name` or `name`). */
function packageName(specifier: string): string {
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
}

// --- the tests ---------------------------------------------------------------------------

describe('YAML files of the repository', () => {
  const yamlFiles = repositoryFiles().filter((file) => /\.ya?ml$/.test(file));

  it('include every Kubernetes manifest this test expects, and no other file in the k8s directory', () => {
    expect(yamlFiles.filter((file) => file.startsWith(`${K8S}/`)).sort()).toEqual(Object.keys(MANIFESTS).sort());
  });

  it.each(yamlFiles)('%s parses strictly: no duplicate keys, no unintended document, same meaning in YAML 1.1', (file) => {
    expect(yamlProblems(readFileSync(path.join(REPO, file), 'utf8'), MANIFESTS[file]?.length ?? 1)).toEqual([]);
  });

  it('catches the seed\'s broken manifest: a second half pasted from the first', () => {
    const text = readFileSync(path.join(REPO, `${K8S}/gateway-deployment.yaml`), 'utf8');
    expect(yamlProblems(text)).toEqual([]);
    expect(yamlProblems(text + text).join('\n')).toMatch(/Map keys must be unique/);
    expect(yamlProblems(`${text}---\n${text}`)).toContain('has 2 documents, expected 1');
    expect(yamlProblems(`${text}  enableServiceLinks: on\n`)[0]).toMatch(/YAML 1\.1/);
  });
});

describe('Kubernetes manifests', () => {
  it.each(Object.entries(MANIFESTS))('%s has the expected apiVersion and kind', (file, expected) => {
    expect(manifest(file).map((document) => [document.apiVersion, document.kind])).toEqual(expected);
  });

  it('48.16: deploy the image tag the Dockerfile\'s build command makes, the package\'s version', () => {
    const dockerfile = readFileSync(path.join(REPO, DOCKERFILE), 'utf8');
    const built = [...dockerfile.matchAll(/^#\s+docker build .*-t (\S+) \.$/gm)].map((match) => match[1]);
    const run = [...dockerfile.matchAll(/^#\s+docker run .* -p 30000:30000 (\S+)/gm)].map((match) => match[1]);
    const version = (JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
    expect(built).toEqual([`express-dp-router-gateway:${version}`]);
    expect(new Set(run)).toEqual(new Set(built));
    const images = Object.keys(MANIFESTS).flatMap((file) =>
      manifest(file).flatMap((document) => (document.spec?.template?.spec?.containers ?? []).map((container: { image: string }) => container.image)),
    );
    const gateways = images.filter((image) => image.startsWith('express-dp-router-gateway'));
    expect(gateways.length).toBeGreaterThan(0);
    expect(new Set(gateways)).toEqual(new Set([`express-dp-router-gateway:${version}`]));
  });

  it('name no kind and name twice (a pasted copy of a whole document)', () => {
    const names = Object.keys(MANIFESTS).flatMap((file) => manifest(file).map((document) => `${document.kind}/${document.metadata?.name ?? file}`));
    expect(names.length).toBe(new Set(names).size);
  });

  it('give Kubernetes strings where it wants strings (args, command, env values, labels, annotations)', () => {
    const notStrings: string[] = [];
    const check = (where: string, values: unknown) => {
      for (const [key, value] of Object.entries((values ?? {}) as Record<string, unknown>)) if (typeof value !== 'string') notStrings.push(`${where}.${key}: ${JSON.stringify(value)}`);
    };
    for (const file of Object.keys(MANIFESTS)) {
      for (const document of manifest(file)) {
        const where = `${file} ${document.kind}`;
        for (const metadata of [document.metadata, document.spec?.template?.metadata]) {
          check(`${where} labels`, metadata?.labels);
          check(`${where} annotations`, metadata?.annotations);
        }
        for (const spec of document.spec?.template?.spec?.containers ?? []) {
          check(`${where} ${spec.name} args`, spec.args);
          check(`${where} ${spec.name} command`, spec.command);
          check(`${where} ${spec.name} env`, Object.fromEntries((spec.env ?? []).map((variable: { name: string; value?: unknown }) => [variable.name, variable.value ?? ''])));
        }
      }
    }
    expect(notStrings).toEqual([]);
  });

  it('kustomization.yaml lists the gateway Deployment and Service and the headless Service it finds vLLM by, files that exist', () => {
    const kustomization = byKind(`${K8S}/kustomization.yaml`, 'Kustomization');
    expect(kustomization.resources).toEqual(['gateway-deployment.yaml', 'gateway-service.yaml', 'vllm-headless-service.yaml']);
    for (const resource of kustomization.resources) expect(existsSync(path.join(REPO, K8S, resource))).toBe(true);
  });

  it('the gateway Deployment: 2 replicas, probes, requests, a selector that matches its pods', () => {
    const deployment = gatewayDeployment();
    const spec = gatewayContainer();
    expect(deployment.spec.replicas).toBe(2);
    expect(selects(deployment.spec.selector.matchLabels, deployment.spec.template.metadata.labels)).toBe(true);
    expect(spec.image).toEqual(expect.any(String));
    expect(spec.livenessProbe.httpGet.path).toBe('/healthz');
    expect(spec.readinessProbe.httpGet.path).toBe('/readyz');
    expect(spec.resources.requests).toEqual({ cpu: expect.any(String), memory: expect.any(String) });
    expect(deployment.spec.template.spec.securityContext.runAsNonRoot).toBe(true);
  });

  it('the gateway Deployment gives the drain time to finish before SIGKILL', () => {
    const deployment = gatewayDeployment();
    const preStop = gatewayContainer().lifecycle?.preStop?.exec?.command ?? [];
    const pauseSeconds = preStop[0] === 'sleep' ? Number(preStop[1]) : 0;
    expect(deployment.spec.template.spec.terminationGracePeriodSeconds * 1000).toBeGreaterThan(manifestSettings(gatewayContainer()).drainTimeoutMs + pauseSeconds * 1000);
  });

  it('the gateway args are flags the example server accepts, on the container port, on all interfaces', () => {
    const spec = gatewayContainer();
    const settings = manifestSettings(spec);
    expect(settings.port).toBe(containerPort(spec, 'http'));
    expect(settings.host).toBe('0.0.0.0');
    for (const probe of [spec.livenessProbe, spec.readinessProbe]) expect(containerPort(spec, probe.httpGet.port)).toBe(settings.port);
  });

  it('the gateway Service and the Prometheus scraping reach the gateway pods and port', () => {
    const deployment = gatewayDeployment();
    const podLabels = deployment.spec.template.metadata.labels;
    const spec = gatewayContainer();
    const port = manifestSettings(spec).port;

    const service = gatewayService();
    expect(selects(service.spec.selector, podLabels)).toBe(true);
    for (const servicePort of service.spec.ports) expect(containerPort(spec, servicePort.targetPort)).toBe(port);

    const annotations = deployment.spec.template.metadata.annotations;
    expect(annotations).toMatchObject({ 'prometheus.io/scrape': 'true', 'prometheus.io/port': String(port), 'prometheus.io/path': '/metrics' });

    const podMonitor = byKind(`${K8S}/gateway-podmonitor.yaml`, 'PodMonitor');
    expect(selects(podMonitor.spec.selector.matchLabels, podLabels)).toBe(true);
    for (const endpoint of podMonitor.spec.podMetricsEndpoints) {
      expect(containerPort(spec, endpoint.port)).toBe(port);
      expect(endpoint.path).toBe('/metrics');
    }
  });

  it("the optional peers Service selects the gateway pods on UDP, and the flags its comment gives parse", () => {
    const peers = byKind(`${K8S}/gateway-peers-service.yaml`, 'Service');
    expect(peers.spec.clusterIP).toBe('None');
    expect(selects(peers.spec.selector, gatewayDeployment().spec.template.metadata.labels)).toBe(true);
    expect(peers.spec.ports).toEqual([{ name: 'peers', port: 7946, targetPort: 7946, protocol: 'UDP' }]);
    const comment = readFileSync(path.join(REPO, `${K8S}/gateway-peers-service.yaml`), 'utf8');
    const flags = [...comment.matchAll(/(--peer-[a-z]+=\S+)/g)].map((match) => match[1]);
    expect(flags).toEqual(['--peer-listen=0.0.0.0:7946', '--peer-dns=dp-gateway-peers.default.svc.cluster.local:7946']);
    const settings = parseCommandLine(flags, { DP_ROUTER_PEER_SECRET: 'from the Secret, 16+ characters' }) as GatewaySettings;
    expect(settings.peers).toMatchObject({ listen: '0.0.0.0:7946', dns: { name: `${peers.metadata.name}.default.svc.cluster.local`, port: peers.spec.ports[0].port } });
  });

  it('the gateway routes to the vLLM example: its Service, port and --data-parallel-size 8 with one GPU per rank', () => {
    const settings = manifestSettings(gatewayContainer());
    const vllm = container(vllmDeployment(), 'vllm');
    const service = vllmService();
    const dataParallelSize = Number(flagValue(vllm.args, '--data-parallel-size'));
    expect(dataParallelSize).toBe(8);
    expect(Number(vllm.resources.limits['nvidia.com/gpu'])).toBe(dataParallelSize * Number(flagValue(vllm.args, '--tensor-parallel-size') ?? 1));
    expect(vllm.command).toEqual(['vllm', 'serve']);
    expect(containerPort(vllm, service.spec.ports[0].targetPort)).toBe(Number(flagValue(vllm.args, '--port')));
    expect(selects(service.spec.selector, vllmDeployment().spec.template.metadata.labels)).toBe(true);
    expect(settings.upstreams).toHaveLength(1);
    // The gateway finds the pods through the headless Service: one A record per ready pod.
    const headless = vllmPodsService();
    const { dns } = settings.upstreams[0] as { dns?: { name: string; port: number } };
    expect(headless.spec.clusterIP).toBe('None');
    expect(selects(headless.spec.selector, vllmDeployment().spec.template.metadata.labels)).toBe(true);
    expect(containerPort(vllm, headless.spec.ports[0].targetPort)).toBe(Number(flagValue(vllm.args, '--port')));
    expect(dns?.name.split('.').slice(0, 3)).toEqual([headless.metadata.name, 'default', 'svc']);
    expect(dns?.port).toBe(headless.spec.ports[0].port);
    // The gateway routes every rank the server runs, no more (every rank from 0: no `ranks` list).
    expect(settings.upstreams[0]).toMatchObject({ startRank: 0, dataParallelSize });
    expect(settings.upstreams[0].ranks).toBeUndefined();
  });

  it('render with kustomize, when kubectl is there', () => {
    const kubectl = findExecutable('kubectl');
    if (!kubectl) {
      console.warn('SKIPPED: kubectl was not found, so `kubectl kustomize example-server/k8s` was not tried (the other manifest checks ran).');
      return;
    }
    const rendered = spawnSync(kubectl, ['kustomize', path.join(REPO, K8S)], { encoding: 'utf8' });
    expect(rendered.stderr).toBe('');
    expect(parseAllDocuments(rendered.stdout).map((document) => document.toJS().kind).sort()).toEqual(['Deployment', 'Service', 'Service']);
  });
});

describe('the example server started with the manifest\'s args', () => {
  let mock: MockVllm;
  let gateway: RunningGateway;
  const spec = () => gatewayContainer();

  beforeAll(async () => {
    const settings = manifestSettings(spec());
    const dataParallelSize = Number(flagValue(container(vllmDeployment(), 'vllm').args, '--data-parallel-size'));
    mock = await startMockVllm({ dataParallelSize });
    // The pods the headless Service names become the local mock; port 0 and loopback instead of the pod's.
    gateway = await startExampleGateway({
      ...settings,
      port: 0,
      host: '127.0.0.1',
      drainTimeoutMs: 1000,
      upstreams: settings.upstreams.map((upstream) => ('dns' in upstream && upstream.dns !== undefined ? atUrl(upstream, mock.url) : upstream)),
    });
    expect(gateway.mock).toBeUndefined();
  });

  afterAll(async () => {
    await gateway?.close();
    await mock?.close();
  });

  it('answers the liveness and readiness probe paths with 200', async () => {
    for (const probe of [spec().livenessProbe, spec().readinessProbe]) {
      const answer = await fetch(gateway.url + probe.httpGet.path);
      expect([probe.httpGet.path, answer.status]).toEqual([probe.httpGet.path, 200]);
    }
    expect(await (await fetch(`${gateway.url}/readyz`)).json()).toMatchObject({ status: 'ready', healthyEndpoints: 8 });
  });

  it('serves the scrape path with every rank of the vLLM example', async () => {
    const annotations = gatewayDeployment().spec.template.metadata.annotations;
    const answer = await fetch(gateway.url + annotations['prometheus.io/path']);
    expect(answer.status).toBe(200);
    const text = await answer.text();
    for (let rank = 0; rank < 8; rank++) expect(text).toMatch(new RegExp(`dp_router_endpoint_healthy\\{[^}]*rank="${rank}"[^}]*\\} 1`));
  });

  it('proxies a completion to the upstream', async () => {
    const answer = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    });
    expect(answer.status).toBe(200);
    await answer.text();
    expect(mock.stats().requests.filter((request) => request.path === '/v1/chat/completions')).toHaveLength(1);
  });

  it('answers liveness without touching the upstream', async () => {
    const forwarded = () => mock.stats().requests.filter((request) => !['/metrics', '/health'].includes(request.path)).length;
    const before = forwarded();
    for (let probe = 0; probe < 5; probe++) expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    expect(forwarded()).toBe(before);

    // And with an upstream that refuses every connection.
    const closedPort = await freePort();
    const settings = manifestSettings(spec());
    const dead = await startExampleGateway({ ...settings, port: 0, host: '127.0.0.1', drainTimeoutMs: 1000, upstreams: [atUrl(settings.upstreams[0], `http://127.0.0.1:${closedPort}`)] });
    try {
      expect(await (await fetch(`${dead.url}/healthz`)).json()).toEqual({ status: 'ok' });
    } finally {
      await dead.close();
    }
  });

  it('answers readiness 503 while the health checks find vLLM down, and 200 once it is back', async () => {
    const settings = manifestSettings(spec());
    expect(settings.healthCheckMs).toBeGreaterThan(0);
    // The manifest's interval, shortened so the test does not wait out two real probes.
    const checked = await startExampleGateway({ ...settings, healthCheckMs: 50, port: 0, host: '127.0.0.1', drainTimeoutMs: 1000, upstreams: [atUrl(settings.upstreams[0], mock.url)] });
    const readiness = async () => (await fetch(checked.url + spec().readinessProbe.httpGet.path)).status;
    const eventually = async (status: number) => {
      // Gives up quietly: the caller's expect() then shows the status it got instead.
      await waitFor(async () => (await readiness()) === status, 5_000).catch(() => undefined);
      return readiness();
    };
    try {
      expect(await eventually(200)).toBe(200);
      mock.fault = { kind: 'status', status: 503 };
      expect(await eventually(503)).toBe(503);
      expect((await fetch(checked.url + spec().livenessProbe.httpGet.path)).status).toBe(200);
      mock.fault = undefined;
      expect(await eventually(200)).toBe(200);
    } finally {
      mock.fault = undefined;
      await checked.close();
    }
  });
});

describe('example-server/Dockerfile', () => {
  const stages = readDockerfile();
  const final = stages[stages.length - 1];
  const entrypoint = () => execForm(last(final, 'ENTRYPOINT'));
  const cmd = () => execForm(last(final, 'CMD'));
  const compile = () => stages[0].instructions.find((instruction) => instruction.keyword === 'RUN' && /^npx tsc /.test(instruction.args))!;
  const npmStart = () => {
    const start = JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')).scripts.start as string;
    // `exec`: the shell npm runs the script in gives way to node, which then gets npm's SIGTERM.
    const match = /^(?:exec )?(?:tsx|node --import tsx) (\S+)\.ts$/.exec(start);
    if (!match) throw new Error(`npm start is ${JSON.stringify(start)}; teach this test what it runs`);
    return match[1];
  };

  it('is multi-stage: builds with dev dependencies, runs with npm ci --omit=dev on a Node the package supports', () => {
    expect(stages.map((stage) => stage.name)).toEqual(['build', 'runtime']);
    const engines = JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')).engines.node as string;
    for (const stage of stages) {
      expect(stage.base).toMatch(/^node:\d+/);
      expect(Number(/^node:(\d+)/.exec(stage.base)![1])).toBeGreaterThanOrEqual(Number(/\d+/.exec(engines)![0]));
    }
    // The image runs the newest Node line CI tests (.ci/node.sh), so what ships is what was tested.
    const ciMajors = /^CI_NODE_MAJORS=\(([\d ]+)\)$/m.exec(readFileSync(path.join(REPO, '.ci/node.sh'), 'utf8'))![1].split(' ').map(Number);
    for (const stage of stages) expect(Number(/^node:(\d+)/.exec(stage.base)![1])).toBe(Math.max(...ciMajors));
    const runs = (stage: Stage) => stage.instructions.filter((instruction) => instruction.keyword === 'RUN').map((instruction) => instruction.args);
    expect(runs(stages[0]).some((line) => /^npm ci\b/.test(line) && !/--omit/.test(line))).toBe(true);
    expect(runs(final).some((line) => /^npm ci\b.*--omit=dev/.test(line))).toBe(true);
    expect(compile()).toBeDefined();
    // The runtime image takes only package files from the context; the code comes compiled.
    const copies = final.instructions.filter((instruction) => instruction.keyword === 'COPY');
    expect(copies.map((instruction) => instruction.args)).toEqual(['package.json package-lock.json ./', expect.stringMatching(/^--from=build \S+ \S+$/)]);
  });

  it('runs as a non-root user', () => {
    const user = last(final, 'USER');
    expect(user).toBeDefined();
    expect(user!.args.split(':')[0]).not.toMatch(/^(root|0)$/);
    const at = (keyword: string) => final.instructions.findIndex((instruction) => instruction.keyword === keyword);
    expect(at('USER')).toBeLessThan(at('ENTRYPOINT'));
  });

  it('starts node itself as PID 1, on the module npm start runs', () => {
    // Exec form: no /bin/sh in front of node to swallow SIGTERM.
    expect(entrypoint()[0]).toBe('node');
    expect(entrypoint()).toHaveLength(2);
    const outDir = /--outDir\s+(\S+)/.exec(compile().args)![1];
    expect(/--rootDir\s+\.(\s|$)/.test(compile().args)).toBe(true);
    expect(path.posix.relative(outDir, entrypoint()[1]).replace(/\.js$/, '')).toBe(npmStart());
    expect(cmd()).toEqual(expect.any(Array));
  });

  it('exposes the port its default command listens on, the one the Deployment uses', () => {
    const settings = parseCommandLine(cmd(), stageEnv(final));
    if (settings === 'help') throw new Error('CMD asks for --help');
    expect(last(final, 'EXPOSE')!.args).toBe(String(settings.port));
    expect(settings.host).toBe('0.0.0.0');
    expect(settings.port).toBe(containerPort(gatewayContainer(), 'http'));
  });

  it('has an ignore file that keeps the context to what it copies', () => {
    const ignored = dockerignore(readFileSync(path.join(REPO, DOCKERIGNORE), 'utf8'));
    for (const file of ['node_modules/express/index.js', '.git/HEAD', 'dist/cjs/index.js', '__tests__/hint.test.ts', 'bench/decide.ts', `${K8S}/gateway-deployment.yaml`, '.env']) {
      expect([file, ignored(file)]).toEqual([file, true]);
    }
    for (const file of ['package.json', 'package-lock.json', 'tsconfig.json', 'lib/index.ts', 'example-server/main.ts', 'example-server/mock-vllm/engine.ts']) {
      expect([file, ignored(file)]).toEqual([file, false]);
    }
  });

  describe('built and run without Docker', () => {
    let build: SimulatedBuild;
    let runtime: string;

    beforeAll(async () => {
      build = await simulateBuild(stages, buildContext());
      runtime = build.workdirs.get(final.name)!;
    }, 120_000);

    afterAll(() => {
      if (build) rmSync(build.root, { recursive: true, force: true });
    });

    it('compiles the entry point from exactly the files of the build context', () => {
      expect(existsSync(path.join(runtime, entrypoint()[1]))).toBe(true);
      expect(existsSync(path.join(runtime, 'lib'))).toBe(false);
      expect(filesUnder(runtime).filter((file) => file.endsWith('.ts'))).toEqual([]);
    });

    it('installs every package the compiled gateway requires as a production dependency', () => {
      const pkg = JSON.parse(readFileSync(path.join(runtime, 'package.json'), 'utf8'));
      const lock = JSON.parse(readFileSync(path.join(REPO, 'package-lock.json'), 'utf8'));
      const required = new Set<string>();
      for (const file of filesUnder(path.join(runtime, 'build')).filter((name) => name.endsWith('.js'))) {
        for (const [, specifier] of readFileSync(file, 'utf8').matchAll(/require\("([^"]+)"\)/g)) {
          if (specifier.startsWith('.') || specifier.startsWith('node:') || builtinModules.includes(specifier)) continue;
          required.add(packageName(specifier));
        }
      }
      expect([...required].sort()).toEqual(expect.arrayContaining(['express', 'http-proxy-middleware', 'prom-client']));
      for (const name of required) {
        expect([name, pkg.dependencies?.[name] !== undefined, pkg.devDependencies?.[name]]).toEqual([name, true, undefined]);
        // npm ci accepts the edited package.json only if the lockfile still satisfies it.
        const locked = lock.packages[`node_modules/${name}`].version;
        if (/^\d+\.\d+\.\d+$/.test(pkg.dependencies[name])) expect([name, pkg.dependencies[name]]).toEqual([name, locked]);
      }
      expect(build.npmCi.get(final.name)).toEqual([expect.stringMatching(/--omit=dev/)]);
      // Loaded only for exact prefix routing (the embedded mock's KV events, --tokenizer), by a
      // require the scan above cannot see: every optional peer dependency ships in the image.
      const optional = Object.keys(JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')).peerDependenciesMeta);
      for (const name of optional) expect([name, pkg.dependencies?.[name] !== undefined]).toEqual([name, true]);
    });

    /** The image's ENTRYPOINT with `args` (as `docker run image args…`), on a free port. */
    const runImage = async (args: readonly string[]) => {
      const port = await freePort();
      const child = spawn(process.execPath, [...entrypoint().slice(1), ...args], {
        cwd: runtime,
        env: { PATH: process.env.PATH, ...stageEnv(final), PORT: String(port) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const output = { text: '' };
      child.stdout.on('data', (chunk) => (output.text += chunk));
      child.stderr.on('data', (chunk) => (output.text += chunk));
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      return { child, output, exited, base: `http://127.0.0.1:${port}` };
    };

    it('routes on the embedded mock\'s KV events with --policy prefix-aware (index=exact)', async () => {
      const image = await runImage([...cmd(), '--policy', 'prefix-aware', '--expose-decision', '--mock-port', '0']);
      try {
        await waitFor(() => /listening on http:\/\/0\.0\.0\.0:/.test(image.output.text), 15_000, () => `the image's command did not start:\n${image.output.text}`);
        expect(image.output.text).toMatch(/policy prefix-aware \(exact, on KV events\)/);
        expect(image.output.text).not.toMatch(/publishes no KV events/);
        const decisions: string[] = [];
        await waitFor(
          async () => {
            const answer = await fetch(`${image.base}/v1/chat/completions`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: 'You are a helpful assistant. '.repeat(20) }, { role: 'user', content: `q${decisions.length}` }], max_tokens: 1 }),
            });
            await answer.arrayBuffer();
            decisions.push(answer.headers.get('x-dp-router-decision') ?? '');
            return decisions[decisions.length - 1].endsWith('; index=exact');
          },
          10_000,
          () => `no exact decision in ${JSON.stringify(decisions)}:\n${image.output.text}`,
          50,
        );
      } finally {
        image.child.kill('SIGKILL');
      }
    }, 30_000);

    it('names a tokenizer it cannot load once, with the package named once', async () => {
      // A directory that exists (the command line refuses a missing path) and holds no tokenizer.
      const empty = mkdtempSync(path.join(tmpdir(), 'no-tokenizer-'));
      const image = await runImage([...cmd(), '--policy', 'prefix-aware', '--upstream', 'http://127.0.0.1:1', '--kv-events', 'tcp://127.0.0.1:5557', '--tokenizer', empty]);
      const code = await image.exited;
      rmSync(empty, { recursive: true });
      expect(code).toBe(1);
      expect(image.output.text.trim().split('\n')).toEqual([expect.stringMatching(/^express-dp-router: `prefixAware\.tokenizer` could not be loaded: /)]);
    });

    it('starts with its ENTRYPOINT and CMD, serves the probes, and drains a stream on SIGTERM', async () => {
      const port = await freePort();
      // As `docker run -e PORT=<port> image <CMD> --mock-decode-ms 20`: a slow stream to drain.
      const child = spawn(process.execPath, [...entrypoint().slice(1), ...cmd(), '--mock-decode-ms', '20'], {
        cwd: runtime,
        env: { PATH: process.env.PATH, ...stageEnv(final), PORT: String(port) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (chunk) => (output += chunk));
      child.stderr.on('data', (chunk) => (output += chunk));
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      try {
        await waitFor(() => /listening on http:\/\/0\.0\.0\.0:/.test(output), 15_000, () => `the image's command did not start:\n${output}`);
        const base = `http://127.0.0.1:${port}`;
        expect((await fetch(`${base}/healthz`)).status).toBe(200);
        expect((await fetch(`${base}/readyz`)).status).toBe(200);

        const stream = await new Promise<http.IncomingMessage>((resolve, reject) => {
          const request = http.request(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve);
          request.on('error', reject);
          request.end(JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'drain me' }], max_tokens: 25, stream: true }));
        });
        expect(stream.statusCode).toBe(200);
        let body = '';
        const ended = new Promise<void>((resolve, reject) => {
          stream.setEncoding('utf8').on('data', (chunk: string) => {
            if (body === '') child.kill('SIGTERM');
            body += chunk;
          });
          stream.on('end', resolve);
          stream.on('error', reject);
        });
        await ended;
        expect(body.endsWith('data: [DONE]\n\n')).toBe(true);
        expect(await exited).toBe(0);
        expect(output).toMatch(/SIGTERM: draining/);
      } finally {
        child.kill('SIGKILL');
      }
    }, 30_000);
  });
});
