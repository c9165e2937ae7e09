/**
 * The Kubernetes manifests as a cluster would take them: `kubectl kustomize` renders production
 * (deploy/k8s) and the single-node overlay (deploy/k8s/dev), every object validates against the
 * OpenAPI schemas of a current Kubernetes (kubernetes-models) or the Prometheus Operator, and the
 * properties an operator relies on hold: hardened pods, probes, PDBs, HPA, NetworkPolicies, NATS.
 * `KUBECTL` names another kubectl (CI's Debian one is 1.20, with kustomize v2.0.3).
 */
import { describe, expect, it } from "@effect/vitest"
import * as monitoringV1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1"
import * as appsV1 from "kubernetes-models/apps/v1"
import * as autoscalingV2 from "kubernetes-models/autoscaling/v2"
import * as networkingV1 from "kubernetes-models/networking.k8s.io/v1"
import * as policyV1 from "kubernetes-models/policy/v1"
import * as coreV1 from "kubernetes-models/v1"
import { execFileSync, spawnSync } from "node:child_process"
import { readdirSync, readFileSync, statSync } from "node:fs"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { parseAllDocuments } from "yaml"

const root = fileURLToPath(new URL("../../", import.meta.url))
const kubectl = process.env["KUBECTL"] || "kubectl"
const kubectlVersion = spawnSync(kubectl, ["version", "--client"], { encoding: "utf8", timeout: 30_000 })
const hasKubectl = kubectlVersion.status === 0
if (!hasKubectl) {
  console.warn(`k8s.test.ts: skipping the rendering tests: no \`${kubectl}\` answers \`version --client\` (apt-get install -y kubernetes-client)`)
}

// Plain data as YAML gives it; the assertions below read it field by field.
type Obj = { readonly [key: string]: unknown }
const isObj = (value: unknown): value is Obj => typeof value === "object" && value !== null && !Array.isArray(value)
const obj = (value: unknown): Obj => (isObj(value) ? value : {})
const list = (value: unknown): ReadonlyArray<Obj> => (Array.isArray(value) ? value.filter(isObj) : [])
const at = (value: unknown, ...keys: ReadonlyArray<string>): unknown => keys.reduce<unknown>((v, k) => obj(v)[k], value)

interface Resource extends Obj {
  readonly apiVersion: string
  readonly kind: string
  readonly metadata: { readonly name: string; readonly namespace?: string; readonly labels?: Readonly<Record<string, string>> }
}
const isResource = (value: unknown): value is Resource =>
  isObj(value) && typeof value["apiVersion"] === "string" && typeof value["kind"] === "string" && typeof at(value, "metadata", "name") === "string"

const render = (dir: string): ReadonlyArray<Resource> => {
  // kustomize's deprecation warnings go to stderr; only stdout is the rendering.
  const out = execFileSync(kubectl, ["kustomize", path.join(root, dir)], { encoding: "utf8", timeout: 60_000, stdio: ["ignore", "pipe", "pipe"] })
  return parseAllDocuments(out).map((doc) => {
    if (doc.errors.length > 0) throw new Error(`${dir} renders YAML that does not parse: ${doc.errors.join("; ")}`)
    const value: unknown = doc.toJS()
    if (!isResource(value)) throw new Error(`${dir} renders something that is not a Kubernetes object: ${JSON.stringify(value).slice(0, 200)}`)
    return value
  })
}

type ModelClass = new (data: Obj) => { validate(): void }
/** Every apiVersion the manifests may use, with its generated models; any other fails the test. */
const models: Readonly<Record<string, Readonly<Record<string, unknown>>>> = {
  "v1": coreV1,
  "apps/v1": appsV1,
  "autoscaling/v2": autoscalingV2,
  "policy/v1": policyV1,
  "networking.k8s.io/v1": networkingV1,
  "monitoring.coreos.com/v1": monitoringV1
}
const modelOf = (r: Resource): ModelClass => {
  const candidate = models[r.apiVersion]?.[r.kind]
  if (typeof candidate !== "function" || (candidate as { readonly kind?: unknown }).kind !== r.kind) {
    throw new Error(`${r.apiVersion} ${r.kind} ${r.metadata.name}: no schema to validate it against; add its models to k8s.test.ts`)
  }
  return candidate as ModelClass
}
/** The schema errors of one object, or undefined when it is valid. */
const schemaErrors = (r: Resource): string | undefined => {
  try {
    new (modelOf(r))(r).validate()
    return undefined
  } catch (e) {
    return `${r.kind}/${r.metadata.name}: ${e instanceof Error ? e.message : String(e)}`
  }
}

const named = (rs: ReadonlyArray<Resource>, kind: string, name: string): Resource => {
  const found = rs.find((r) => r.kind === kind && r.metadata.name === name)
  if (found === undefined) throw new Error(`no ${kind} ${name}`)
  return found
}
const workloads = (rs: ReadonlyArray<Resource>) => rs.filter((r) => r.kind === "Deployment" || r.kind === "StatefulSet")
const podSpec = (w: Resource) => obj(at(w, "spec", "template", "spec"))
const podLabels = (w: Resource) => obj(at(w, "spec", "template", "metadata", "labels"))
const containers = (w: Resource) => list(podSpec(w)["containers"])
const env = (c: Obj, name: string) => list(c["env"]).find((e) => e["name"] === name)
const selects = (selector: unknown, labels: Obj): boolean => {
  const matchLabels = obj(at(selector, "matchLabels"))
  const expressions = list(at(selector, "matchExpressions"))
  return Object.entries(matchLabels).every(([k, v]) => labels[k] === v) &&
    expressions.every((e) => {
      const values = Array.isArray(e["values"]) ? e["values"] : []
      const key = String(e["key"])
      return e["operator"] === "In" ? values.includes(labels[key]) : e["operator"] === "Exists" ? key in labels : false
    })
}
const portNames = (w: Resource) => new Set(containers(w).flatMap((c) => list(c["ports"]).map((p) => p["name"])))

/** The five Switchboard services and the port each serves its probes and /metrics on. */
const SERVICES = { edge: "http", auth: "metrics", router: "metrics", broker: "metrics", registry: "metrics" } as const

/** Kustomization fields the kustomize in Debian's kubectl 1.20 (v2.0.3) does not know. */
const NEWER_KUSTOMIZE = ["patches", "labels", "replacements", "components", "sortOptions", "openapi", "buildMetadata", "helmCharts"]
const kustomizations = (dir: string): ReadonlyArray<string> =>
  readdirSync(path.join(root, dir)).flatMap((entry) => {
    const full = path.join(dir, entry)
    return statSync(path.join(root, full)).isDirectory() ? kustomizations(full) : entry === "kustomization.yaml" ? [full] : []
  })

describe("deploy/k8s kustomizations", () => {
  it("use only what kustomize v2.0.3 (Debian's kubectl) understands: old field names, files in resources", () => {
    const files = kustomizations("deploy/k8s")
    expect(files.length).toBeGreaterThanOrEqual(3)
    for (const file of files) {
      const k = obj(parseAllDocuments(readFileSync(path.join(root, file), "utf8"))[0]?.toJS())
      expect(NEWER_KUSTOMIZE.filter((field) => field in k), file).toEqual([])
      const resources: ReadonlyArray<unknown> = Array.isArray(k["resources"]) ? k["resources"] : []
      for (const entry of resources.map(String)) {
        expect(statSync(path.join(root, path.dirname(file), entry)).isFile(), `${file}: resources entry ${entry} must be a file`).toBe(true)
      }
    }
  })
})

describe.skipIf(!hasKubectl)(`deploy/k8s rendered by ${kubectl} (${kubectlVersion.stdout?.split("\n")[0] ?? ""})`, () => {
  const prod = hasKubectl ? render("deploy/k8s") : []
  const dev = hasKubectl ? render("deploy/k8s/dev") : []

  it.each([["deploy/k8s", prod], ["deploy/k8s/dev", dev]] as const)("%s: every object validates against its Kubernetes schema", (_dir, rs) => {
    expect(rs.length).toBeGreaterThan(20)
    expect(rs.map(schemaErrors).filter((e) => e !== undefined)).toEqual([])
    for (const r of rs.filter((r) => r.kind !== "Namespace")) expect(r.metadata.namespace, `${r.kind}/${r.metadata.name}`).toBe("switchboard")
  })

  it("fails an object whose field has the wrong type, and an object of a kind it has no schema for", () => {
    const nats = named(prod, "StatefulSet", "nats")
    expect(schemaErrors({ ...nats, spec: { ...obj(nats["spec"]), replicas: "3" } })).toMatch(/replicas must be integer/)
    expect(schemaErrors({ apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w" } })).toMatch(/no schema/)
  })

  it.each([["deploy/k8s", prod], ["deploy/k8s/dev", dev]] as const)("%s: every pod runs non-root on a read-only root with no capabilities, with resources and probes", (_dir, rs) => {
    expect(workloads(rs).map((w) => w.metadata.name).sort()).toEqual(["auth", "broker", "edge", "nats", "registry", "router"])
    for (const w of workloads(rs)) {
      const name = `${w.kind}/${w.metadata.name}`
      expect(at(podSpec(w), "securityContext", "runAsNonRoot"), name).toBe(true)
      expect(at(podSpec(w), "securityContext", "runAsUser"), name).not.toBe(0)
      for (const c of containers(w)) {
        expect(obj(c["securityContext"]), name).toMatchObject({ readOnlyRootFilesystem: true, allowPrivilegeEscalation: false })
        expect(at(c, "securityContext", "capabilities", "drop"), name).toContain("ALL")
        expect(Object.keys(obj(at(c, "resources", "requests"))).sort(), name).toEqual(["cpu", "memory"])
        expect(at(c, "resources", "limits", "memory"), name).toBeTypeOf("string")
        for (const probe of ["readinessProbe", "livenessProbe"]) {
          // A probe's named port must be one the container declares, or the kubelet cannot resolve it.
          const port = at(c, probe, "httpGet", "port")
          expect(typeof port === "number" || portNames(w).has(port), `${name} ${probe} port ${String(port)}`).toBe(true)
        }
      }
    }
  })

  it("probes the edge on /readyz and /healthz, and each service on /healthz of its metrics port", () => {
    const edge = containers(named(prod, "Deployment", "edge"))[0]
    expect(at(edge, "readinessProbe", "httpGet")).toEqual({ path: "/readyz", port: "http" })
    expect(at(edge, "livenessProbe", "httpGet")).toEqual({ path: "/healthz", port: "http" })
    for (const name of ["auth", "router", "broker", "registry"]) {
      const c = containers(named(prod, "Deployment", name))[0]
      expect(list(at(c, "ports")), name).toContainEqual({ containerPort: 9464, name: "metrics" })
      expect(env(obj(c), "METRICS_PORT")?.["value"], name).toBe("9464")
      for (const probe of ["readinessProbe", "livenessProbe"]) expect(at(c, probe, "httpGet"), `${name} ${probe}`).toEqual({ path: "/healthz", port: "metrics" })
    }
  })

  it("gives the edges time to close WebSockets with 1001 before they are killed", () => {
    const edge = named(prod, "Deployment", "edge")
    const c = containers(edge)[0]
    const preStop = Number(at(c, "lifecycle", "preStop", "sleep", "seconds"))
    const grace = /^(\d+)s$/.exec(String(env(obj(c), "EDGE_SHUTDOWN_GRACE")?.["value"]))
    expect(grace).not.toBeNull()
    // The pod's whole grace must cover the preStop pause and the sockets' grace, with room to exit.
    expect(Number(at(podSpec(edge), "terminationGracePeriodSeconds"))).toBeGreaterThan(preStop + Number(grace?.[1]))
  })

  it("scales the edge Deployment with an HPA, and every workload has a PDB that selects its pods", () => {
    const hpa = named(prod, "HorizontalPodAutoscaler", "edge")
    expect(at(hpa, "spec", "scaleTargetRef")).toEqual({ apiVersion: "apps/v1", kind: "Deployment", name: "edge" })
    named(prod, "Deployment", "edge")
    expect(Number(at(hpa, "spec", "minReplicas"))).toBeGreaterThanOrEqual(2)
    const pdbs = prod.filter((r) => r.kind === "PodDisruptionBudget")
    for (const w of workloads(prod)) {
      expect(pdbs.filter((p) => selects(at(p, "spec", "selector"), podLabels(w))).length, `PDBs for ${w.metadata.name}`).toBe(1)
    }
    for (const p of pdbs) expect(workloads(prod).some((w) => selects(at(p, "spec", "selector"), podLabels(w))), p.metadata.name).toBe(true)
  })

  it("denies ingress by default and opens, by the ports each pod declares, only what each pod serves", () => {
    const policies = prod.filter((r) => r.kind === "NetworkPolicy")
    const deny = policies.find((p) => Object.keys(obj(at(p, "spec", "podSelector"))).length === 0 && at(p, "spec", "ingress") === undefined)
    expect(at(deny, "spec", "policyTypes")).toEqual(["Ingress"])
    for (const w of workloads(prod)) {
      const allowing = policies.filter((p) => p !== deny && list(at(p, "spec", "ingress")).length > 0 && selects(at(p, "spec", "podSelector"), podLabels(w)))
      expect(allowing.length, `ingress policies for ${w.metadata.name}`).toBeGreaterThan(0)
      for (const rule of allowing.flatMap((p) => list(at(p, "spec", "ingress")))) {
        for (const port of list(rule["ports"]).map((p) => p["port"])) {
          expect(typeof port === "number" || portNames(w).has(port), `${w.metadata.name}: policy port ${String(port)}`).toBe(true)
        }
      }
    }
    // Switchboard's pods may reach NATS: an egress policy that covers them allows its client port.
    const egress = policies.filter((p) => list(at(p, "spec", "egress")).length > 0)
    for (const name of Object.keys(SERVICES)) {
      const w = named(prod, "Deployment", name)
      const rules = egress.filter((p) => selects(at(p, "spec", "podSelector"), podLabels(w))).flatMap((p) => list(at(p, "spec", "egress")))
      expect(rules.some((r) => list(r["ports"]).some((p) => p["port"] === 4222)), `${name} egress to NATS`).toBe(true)
    }
  })

  it("scrapes /metrics of every Switchboard Deployment through the ServiceMonitor", () => {
    const monitor = named(prod, "ServiceMonitor", "switchboard")
    const endpoints = list(at(monitor, "spec", "endpoints"))
    const services = prod.filter((r) => r.kind === "Service" && selects(at(monitor, "spec", "selector"), obj(r.metadata.labels)))
    for (const [name, port] of Object.entries(SERVICES)) {
      const service = services.find((s) => selects({ matchLabels: at(s, "spec", "selector") }, podLabels(named(prod, "Deployment", name))))
      expect(service, `a monitored Service for ${name}`).toBeDefined()
      const servicePort = list(at(service, "spec", "ports")).find((p) => p["targetPort"] === port)
      expect(endpoints.some((e) => e["port"] === servicePort?.["name"] && e["path"] === "/metrics"), `${name} scraped on ${port}`).toBe(true)
    }
    expect(dev.some((r) => r.kind === "ServiceMonitor"), "the dev overlay needs no Prometheus Operator").toBe(false)
  })

  it("runs NATS as a 3-node JetStream StatefulSet with volumes and GOMAXPROCS from its CPU limit", () => {
    const nats = named(prod, "StatefulSet", "nats")
    expect(at(nats, "spec", "replicas")).toBe(3)
    const claims = list(at(nats, "spec", "volumeClaimTemplates"))
    expect(claims.map((c) => at(c, "metadata", "name"))).toEqual(["data"])
    const c = obj(containers(nats)[0])
    expect(list(c["volumeMounts"])).toContainEqual({ name: "data", mountPath: "/data" })
    expect(at(env(c, "GOMAXPROCS"), "valueFrom", "resourceFieldRef")).toMatchObject({ resource: "limits.cpu" })
    expect(at(c, "resources", "limits", "cpu")).toBeDefined()
    const conf = String(at(named(prod, "ConfigMap", "nats"), "data", "nats.conf"))
    expect(conf).toMatch(/jetstream \{ store_dir: \/data \}/)
    for (const i of [0, 1, 2]) expect(conf).toContain(`nats://nats-${i}.nats:6222`)
    // Stopping a node first puts it in lame duck, through the pid file on a writable volume, and the
    // lame duck fits in the grace period.
    const pidFile = /pid_file: (\S+)/.exec(conf)?.[1]
    expect(at(c, "lifecycle", "preStop", "exec", "command")).toEqual(["/nats-server", "--signal", `ldm=${pidFile}`])
    const pidDir = list(c["volumeMounts"]).find((m) => pidFile?.startsWith(`${String(m["mountPath"])}/`))
    expect(list(at(nats, "spec", "template", "spec", "volumes")).find((v) => v["name"] === pidDir?.["name"])).toHaveProperty("emptyDir")
    const seconds = (key: string) => Number(new RegExp(`${key}: (\\d+)s`).exec(conf)?.[1])
    expect(seconds("lame_duck_duration") + seconds("lame_duck_grace_period")).toBeLessThan(Number(at(nats, "spec", "template", "spec", "terminationGracePeriodSeconds")))
    expect(String(at(named(dev, "ConfigMap", "nats"), "data", "nats.conf"))).toContain(`pid_file: ${pidFile}`)
    // The exporter beside each server is scraped by the ServiceMonitor, through the Service's `metrics` port.
    const exporter = containers(nats).find((x) => list(obj(x)["ports"]).some((p) => p["name"] === "metrics"))
    expect(String(at(exporter, "args")), "the exporter reads the server's monitoring port").toContain("http://localhost:8222")
    const service = named(prod, "Service", "nats")
    expect(at(service, "metadata", "labels", "app.kubernetes.io/part-of")).toBe("switchboard")
    expect(list(at(service, "spec", "ports")).map((p) => p["name"])).toContain("metrics")
    for (const name of Object.keys(SERVICES)) {
      const e = env(obj(containers(named(prod, "Deployment", name))[0]), "SWITCHBOARD_STATE_REPLICAS")
      expect(e?.["value"], name).toBe("3")
    }
  })

  it("gives auth the JWT secret or the JWKS URL from the switchboard-jwt Secret the example creates", () => {
    const auth = obj(containers(named(prod, "Deployment", "auth"))[0])
    const example = parseAllDocuments(readFileSync(path.join(root, "deploy/k8s/secret.example.yaml"), "utf8")).map((d) => obj(d.toJS()))
    const secretName = at(example[0], "metadata", "name")
    for (const [variable, key] of [["SWITCHBOARD_JWT_SECRET", "secret"], ["SWITCHBOARD_JWKS_URL", "jwks-url"]] as const) {
      expect(at(env(auth, variable), "valueFrom", "secretKeyRef"), variable).toMatchObject({ name: secretName, key })
    }
    expect(Object.keys(obj(at(example[0], "stringData")))).toContain("secret")
    // The dev overlay brings its own, so `kubectl apply -k deploy/k8s/dev` is all a laptop needs.
    expect(Object.keys(obj(at(named(dev, "Secret", String(secretName)), "stringData")))).toEqual(["secret"])
  })

  it("dev overlay: one NATS server without a cluster, state R1, one replica of each service", () => {
    const nats = named(dev, "StatefulSet", "nats")
    expect(at(nats, "spec", "replicas")).toBe(1)
    expect(String(at(named(dev, "ConfigMap", "nats"), "data", "nats.conf"))).not.toMatch(/cluster/)
    for (const name of Object.keys(SERVICES)) {
      const d = named(dev, "Deployment", name)
      const c = obj(containers(d)[0])
      expect({ replicas: at(d, "spec", "replicas"), nats: env(c, "NATS_URL")?.["value"], state: env(c, "SWITCHBOARD_STATE_REPLICAS")?.["value"] }, name)
        .toEqual({ replicas: 1, nats: "nats://nats-0.nats:4222", state: "1" })
    }
    expect(at(named(dev, "HorizontalPodAutoscaler", "edge"), "spec", "minReplicas")).toBe(1)
  })

  it("sets only environment variables that Switchboard reads", () => {
    const sources = ["services", "libs"].flatMap((dir) => readdirSync(path.join(root, dir)).map((pkg) => path.join(root, dir, pkg, "src")))
    const text = sources.flatMap((dir) => readdirSync(dir, { recursive: true, encoding: "utf8" })
      .filter((f) => f.endsWith(".ts")).map((f) => readFileSync(path.join(dir, f), "utf8"))).join("\n")
    // GOMAXPROCS is the Go runtime's (NATS).
    const foreign = new Set(["GOMAXPROCS", "POD_NAME"])
    const names = new Set([...prod, ...dev].flatMap((r) => workloads([r])).flatMap(containers).flatMap((c) => list(c["env"]).map((e) => String(e["name"]))))
    expect([...names].filter((n) => !foreign.has(n) && !text.includes(`"${n}"`))).toEqual([])
  })
})
