/**
 * Every subject, header, KV bucket and KV key name Switchboard uses, built by typed functions.
 * Services never write these strings inline. Subjects here are relative: the bus adapter puts them
 * under its namespace (default `sb`), so `router.open` travels as `sb.router.open`.
 */
import { Envelope } from "@switchboard/protocol"
import * as Brand from "effect/Brand"
import type { BucketSpec } from "./Kv.ts"

export type ConnId = string & Brand.Brand<"ConnId">
export const ConnId = Brand.nominal<ConnId>()
/** Edges name connections with UUIDs; anything else a client quotes back is not one. */
const connIdPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
export const isConnId = (s: string): s is ConnId => connIdPattern.test(s)
export type EdgeId = string & Brand.Brand<"EdgeId">
export const EdgeId = Brand.nominal<EdgeId>()

/** The services that host connection actors behind the edge. `echo` exists for benchmarks. */
export type ServiceName = "router" | "broker" | "registry" | "echo"

/** Names from users (user ids, topics) may hold any character; subjects and keys get them encoded. */
const tokenOf = (s: string) => Buffer.from(s, "utf8").toString("base64url")

/** Header names and operations of the envelope between edge and services (`@switchboard/protocol/Envelope`). */
export const Header = Envelope.Header
export type Op = Envelope.Op

/** A connection's open event: a request to the service's queue group, answered once its actor listens. */
export const open = (service: ServiceName): string => `${service}.open`
/** Frames and lifecycle of one connection, consumed by the actor that owns it. */
export const conn = (service: ServiceName, connId: ConnId): string => `${service}.conn.${connId}`
/**
 * A stopping replica asks the service's other replicas (its queue group, which it has left) to
 * adopt one of its connections (request/reply).
 */
export const handoff = (service: ServiceName): string => `${service}.handoff`
/** One replica's own inbox: what a stopping replica forwards with a connection it handed to it. */
export const replicaInbox = (service: ServiceName, replica: string): string => `${service}.replica.${tokenOf(replica)}`
/** Everything for the sockets of one edge process: deliveries and close instructions. */
export const edgeOut = (edgeId: EdgeId): string => `edge.${edgeId}.out`
/** One MCPx topic's sequencer: every accepted envelope, join and leave of the topic, in order. */
export const topic = (name: string): string => `broker.topic.${tokenOf(name)}`
/**
 * A stopping broker replica asks another (request/reply, the broker's queue group) to sequence one
 * of its topics from where it left off.
 */
export const topicHandoff = "broker.topics.handoff"
/**
 * Journals, each one log (one JetStream stream, `<namespace>_<name>`) with a key per thing it
 * records. MCPx history: one journal, a key per topic.
 */
export const JournalName = { history: "history" } as const
/** A journal key for a topic's history (a user's name, encoded as subjects are). */
export const historyKey = (topic: string): string => tokenOf(topic)
/** The subject that holds one key of a journal; every key of `journal` matches `journalSubject(journal, "*")`. */
export const journalSubject = (journal: string, key: string): string => `journal.${journal}.${key}`

/** Plain HTTP requests the edge routes to a service (request/reply, the service's queue group). */
export const http = (service: ServiceName): string => `${service}.http`
/**
 * Requests that need no session (MCP 2026-07-28) from the edge to the service's queue group: any
 * replica answers, on the edge's exchange the request names (`Header.http`).
 */
export const stateless = (service: ServiceName): string => `${service}.stateless`
/**
 * A client closed a stateless request's stream before its answer (MCP 2026-07-28's cancellation):
 * to every replica of the service, since any of them may be working on it.
 */
export const statelessCancelled = (service: ServiceName): string => `${service}.stateless.cancelled`
/**
 * A client cancelled a task (`tasks/cancel`, headers user and task): to every replica of the
 * service, since the one running the task's call is not the one that took the cancel.
 */
export const taskCancelled = (service: ServiceName): string => `${service}.tasks.cancelled`
/**
 * A user's tools may have changed (a tab registered, updated or closed, a tool was cached): one
 * empty message, to every edge that holds a `subscriptions/listen` stream of that user.
 */
export const toolsChanged = (user: string): string => `registry.tools.${tokenOf(user)}.changed`
/** Token verification (request/reply, queue group `auth`). */
export const authVerify = "auth.verify"
/**
 * The router's internal client (request/reply, the router's queue group): another service asks a
 * user's connected extension to do something (the registry's `createTab`), as the proxy itself.
 */
export const routerInternal = "router.internal"

export const Queue = {
  auth: "auth",
  service: (service: ServiceName): string => service
} as const

/**
 * KV buckets, each declared once with its settings (the adapter namespaces names as it does
 * subjects). Liveness keys live three heartbeats of their writers, whose intervals are checked
 * against these TTLs at start.
 */
export const Bucket = {
  /** edge id → heartbeat; expires when an edge dies. */
  edges: { name: "edges", ttl: "15 seconds" },
  /** conn id → the actor record of a connection (service, owning replica, edge, open event). */
  connections: { name: "connections" },
  /** `<service>.<replica>` → heartbeat; expires when a service replica dies. */
  replicas: { name: "replicas", ttl: "6 seconds" },
  /** The proxy protocol's state (router). */
  extensions: { name: "router_extensions" },
  extensionIds: { name: "router_extension_ids" },
  proxyConnections: { name: "router_proxy_connections" },
  sessions: { name: "router_sessions" },
  /** MCPx: topic → the replica sequencing it; topic.participant → membership. */
  topics: { name: "broker_topics" },
  members: { name: "broker_members" },
  /** MCP-B: user.domain.tab → a tab and its tools; user.domain.tool → a cached tool; conn → a socket's session. */
  tabs: { name: "registry_tabs" },
  cachedTools: { name: "registry_cached_tools" },
  registrySessions: { name: "registry_sessions" },
  /**
   * MCP 2026-07-28 tasks: user.task → a task's state and result. Its entries' age limit is the
   * registry's `REGISTRY_TASK_TTL`, given where the bucket is opened; the first replica to create
   * the bucket sets it.
   */
  tasks: { name: "registry_tasks" }
} as const satisfies Record<string, BucketSpec>

/** KV keys use `.` as a token separator, so a prefix is a subject-style filter (`a.b.>`). */
export const Key = {
  edge: (edgeId: EdgeId): string => edgeId,
  connection: (connId: ConnId): string => connId,
  replica: (service: ServiceName, replica: string): string => `${service}.${replica}`,
  replicas: (service: ServiceName): string => `${service}.*`,
  /** A user's extensions live under one prefix; user ids are encoded since `sub` may hold any character. */
  userExtensions: (user: string): string => `${tokenOf(user)}.>`,
  userExtension: (user: string, extensionId: string): string => `${tokenOf(user)}.${extensionId}`,
  /** The stable extension id of one browser (`client_id`) of one user. */
  extensionId: (user: string, clientId: string): string => `${tokenOf(user)}.${tokenOf(clientId)}`,
  proxyConnection: (connectionId: string): string => connectionId,
  session: (connId: ConnId): string => connId,
  topic: (name: string): string => tokenOf(name),
  /**
   * The last history sequence a topic's sequencer sent out (in the topics bucket, next to the
   * claim): whoever sequences the topic next replays the history from there.
   */
  topicDelivered: (name: string): string => `${tokenOf(name)}.delivered`,
  members: (topic: string): string => `${tokenOf(topic)}.>`,
  member: (topic: string, participant: string): string => `${tokenOf(topic)}.${tokenOf(participant)}`,
  /** Everything of one user in a registry bucket (tabs or cached tools). */
  userTools: (user: string): string => `${tokenOf(user)}.>`,
  tab: (user: string, domain: string, tabId: number): string => `${tokenOf(user)}.${tokenOf(domain)}.${tabId}`,
  cachedTool: (user: string, domain: string, tool: string): string => `${tokenOf(user)}.${tokenOf(domain)}.${tokenOf(tool)}`,
  /**
   * A task under its owner: a task id is looked up only under the asking user, so another user's
   * id is not found. Ids come from clients too: encoded like user names.
   */
  task: (user: string, taskId: string): string => `${tokenOf(user)}.${tokenOf(taskId)}`,
  userTasks: (user: string): string => `${tokenOf(user)}.>`
} as const
