/**
 * Typed messages between actors. A service declares its peer protocol once, in
 * `@switchboard/protocol`, as a `Schema.Union` of `Schema.TaggedClass`es (told; a
 * `Schema.TaggedStruct` for one sent per request, whose literal costs nothing to build) and
 * `Schema.TaggedRequest`s (asked: each carries its success and failure Schemas), as
 * `@effect/cluster`'s Entity declares its Rpcs. A message to an actor of this replica goes straight
 * into its mailbox as the value it is, with no encoding; one to another replica is encoded with the
 * Schema and decoded on receipt, where a message that does not decode is logged and dropped.
 */
import { Envelope, Json } from "@switchboard/protocol"
import * as Data from "effect/Data"
import * as AST from "effect/SchemaAST"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as FiberSet from "effect/FiberSet"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { Bus, type BusError, type BusMessage, type BusShape, type Headers, type NoResponders, type RequestTimeout, type Subscription, text, toBytes } from "./Bus.ts"
import * as PeerExit from "./PeerExit.ts"
import * as Subjects from "./Subjects.ts"

/** An ask got no answer in time: the actor is busy, gone without a word, or never answers. */
export class PeerTimeout extends Data.TaggedError("PeerTimeout")<{
  readonly to: string
  readonly tag: string
  readonly timeout: Duration.Duration
}> {
  override get message() {
    return `${this.tag} to ${this.to}: no answer within ${Duration.format(this.timeout)}`
  }
}

/** An ask could not be delivered, or its answer could not be read. */
export class PeerUnavailable extends Data.TaggedError("PeerUnavailable")<{
  /** `NoResponders`: nobody listens (the actor is gone); `Bus`: the bus failed; `Malformed`: the answer does not decode. */
  readonly reason: "NoResponders" | "Bus" | "Malformed"
  readonly to: string
  readonly tag: string
  readonly cause?: unknown
}> {
  override get message() {
    return `${this.tag} to ${this.to}: ${this.reason === "NoResponders" ? "nobody listens" : this.reason === "Bus" ? "the bus failed" : "malformed answer"}`
  }
}

export interface Message {
  readonly _tag: string
}
/** The members of a protocol that are asked (they carry success and failure Schemas). */
export type Ask<M> = Extract<M, Schema.TaggedRequest.All>
/** The members of a protocol that are told. */
export type Tell<M> = Exclude<M, Schema.TaggedRequest.All>
export type Success<Req> = Schema.WithResult.Success<Req>
export type Failure<Req> = Schema.WithResult.Failure<Req>

/** How the receiver of a request answers it; it may keep it and answer later. Answering never fails (a failure is logged). */
export interface Reply<Req extends Schema.TaggedRequest.All> {
  readonly succeed: (value: Success<Req>) => Effect.Effect<void>
  readonly fail: (error: Failure<Req>) => Effect.Effect<void>
  readonly complete: (exit: Exit.Exit<Success<Req>, Failure<Req>>) => Effect.Effect<void>
  /**
   * Where a remote asker waits: all of a reply that survives a hand-off (see `replyAt`).
   * `undefined` for an asker on this replica, which times out if its target is handed over first.
   */
  readonly subject: string | undefined
}

/** Given the request it came with, the reply to it. A told message has nobody to answer. */
export type ReplyTo = <Req extends Schema.TaggedRequest.All>(request: Req) => Reply<Req>

/** How a connection reaches its peers: the mailboxes of this replica's actors, and the bus for the rest. */
export interface Route {
  readonly bus: BusShape
  readonly service: Subjects.ServiceName
  readonly local: (target: Subjects.ConnId) => { readonly offer: (message: BusMessage) => void } | undefined
}

/** Whoever sends: an actor's `Connection`, or `outside(...)` for code that is no actor. */
export interface Sender {
  readonly route: Route
}

/** A sender that is no actor (an HTTP handler, say): everything it sends goes over the bus. */
export const outside = (bus: BusShape, service: Subjects.ServiceName): Sender => ({ route: { bus, service, local: () => undefined } })

export interface AskOptions {
  readonly timeout?: Duration.DurationInput
  readonly traceparent?: string
}

const DEFAULT_TIMEOUT = Duration.seconds(5)
/** A peer message carries a client's frame (depth-checked where it came in) one level down at most. */
const PEER_DEPTH = Json.MAX_DEPTH + 1

/** A member of a protocol's union: a tagged class or request, or a `Schema.TaggedStruct`. */
type Member = Schema.Schema.AnyNoContext

/** The tag that names a member's messages on the wire: a class's static `_tag`, or a tagged struct's `_tag` literal. */
const tagOf = (member: Member): string | undefined => {
  const tag: unknown = (member as { readonly _tag?: unknown })._tag
  if (typeof tag === "string") return tag
  const ast = member.ast
  if (!AST.isTypeLiteral(ast)) return undefined
  const field = ast.propertySignatures.find((p) => p.name === "_tag")
  return field !== undefined && AST.isLiteral(field.type) && typeof field.type.literal === "string" ? field.type.literal : undefined
}

interface Codec {
  readonly encode: (value: Message) => string
}

/** A peer message that never left the process: it reads like one from the bus, and is encoded only if a hand-off forwards it. */
class LocalPeerMessage implements BusMessage {
  readonly reply = undefined
  private bytes: Uint8Array | undefined
  constructor(
    private readonly route: Route,
    private readonly target: Subjects.ConnId,
    private readonly headers: Headers,
    private readonly codec: Codec,
    readonly value: Message,
    readonly replyTo: ReplyTo
  ) {}
  get subject() {
    return Subjects.conn(this.route.service, this.target)
  }
  get data() {
    return (this.bytes ??= toBytes(this.codec.encode(this.value)))
  }
  header(name: string) {
    return this.headers[name]
  }
}

const emptyBody = new Uint8Array(0)

/** A reply that travels back over the bus to `subject`, encoded with the request's exit Schema. */
const remoteReply = <Req extends Schema.TaggedRequest.All>(bus: BusShape, subject: string, codec: PeerExit.ExitCodec): Reply<Req> => {
  const to: BusMessage = { subject, data: emptyBody, reply: subject, header: () => undefined }
  const complete = (exit: Exit.Exit<Success<Req>, Failure<Req>>) =>
    Effect.suspend(() => {
      const body = codec.encode(exit)
      // A value its own Schema cannot encode is a bug of the receiver; the asker still hears of it.
      if (Either.isLeft(body)) {
        return Effect.zipRight(
          Effect.logError("peer: could not encode an answer", body.left),
          bus.respond(to, JSON.stringify({ _tag: "Failure", cause: { _tag: "Die", defect: "unencodable answer" } }))
        )
      }
      return bus.respond(to, body.right)
    }).pipe(Effect.catchAll((e) => Effect.logWarning("peer: could not answer a request", e)))
  return {
    subject,
    complete,
    succeed: (value) => complete(Exit.succeed(value)),
    fail: (error) => complete(Exit.fail(error))
  }
}

const localReply = <Req extends Schema.TaggedRequest.All>(done: Deferred.Deferred<Success<Req>, Failure<Req>>): Reply<Req> => ({
  subject: undefined,
  complete: (exit) => Effect.asVoid(Deferred.done(done, exit)),
  succeed: (value) => Effect.asVoid(Deferred.succeed(done, value)),
  fail: (error) => Effect.asVoid(Deferred.fail(done, error))
})

/** What a told message offers to answer with: nobody waits, so an answer is only logged. */
const nobody: Reply<Schema.TaggedRequest.Any> = {
  subject: undefined,
  complete: () => Effect.logWarning("peer: answered a message that nobody asked"),
  succeed: () => Effect.logWarning("peer: answered a message that nobody asked"),
  fail: () => Effect.logWarning("peer: answered a message that nobody asked")
}
const noReply: ReplyTo = <Req extends Schema.TaggedRequest.All>() => nobody as unknown as Reply<Req>

/**
 * A service's peer protocol: `tell` and `ask` an actor by its connection id, `call` and `serve` a
 * service's own subject (a queue group). Build one per service from its union in `@switchboard/protocol`.
 */
export class Protocol<M extends Message> implements Codec {
  private readonly members = new Map<string, {
    readonly encode: (value: M) => string
    readonly decode: (parsed: unknown) => Either.Either<M, ParseResult.ParseError>
    readonly decodeFast: ((parsed: unknown) => M | undefined) | undefined
  }>()
  /** Header records per tag, the same record every time: adapters may cache what they derive from it. */
  private readonly untraced = new Map<string, Headers>()

  constructor(members: ReadonlyArray<Member>, fast?: FastPaths<M>) {
    const encoders = fast?.encode as Record<string, (value: M) => string> | undefined
    const decoders = fast?.decode as Record<string, (parsed: unknown) => M | undefined> | undefined
    for (const member of members) {
      const tag = tagOf(member)
      if (tag === undefined) throw new Error("a peer protocol's members are tagged classes, tagged requests or tagged structs")
      this.members.set(tag, {
        encode: encoders?.[tag] ?? Schema.encodeSync(Schema.parseJson(member)) as (value: M) => string,
        decode: Schema.decodeUnknownEither(member) as (parsed: unknown) => Either.Either<M, ParseResult.ParseError>,
        decodeFast: decoders?.[tag]
      })
      this.untraced.set(tag, Envelope.encodeEdgeIn({ _tag: "Peer", kind: tag }))
    }
  }

  /** A message as it travels over the bus. */
  encode(value: Message): string {
    const member = this.members.get(value._tag)
    if (member === undefined) throw new Error(`peer: ${value._tag} is not a member of this protocol`)
    return member.encode(value as M)
  }

  private headers(tag: string, traceparent: string | undefined): Headers {
    return (traceparent === undefined ? this.untraced.get(tag) : undefined) ?? Envelope.encodeEdgeIn({ _tag: "Peer", kind: tag, traceparent })
  }

  /**
   * Sends `message` to the actor of `target`, in order with its frames: into its mailbox, as is,
   * when it lives on this replica; encoded over the bus otherwise. Never blocks.
   */
  tell(from: Sender, target: Subjects.ConnId, message: Tell<M>, traceparent?: string): void {
    const route = from.route
    const headers = this.headers(message._tag, traceparent)
    const mailbox = route.local(target)
    if (mailbox !== undefined) return mailbox.offer(new LocalPeerMessage(route, target, headers, this, message, noReply))
    route.bus.unsafePublish(Subjects.conn(route.service, target), this.encode(message), headers)
  }

  /** Publishes `message` on a subject that is no actor's (a topic's sequencer, say): always encoded. */
  publish(bus: BusShape, subject: string, message: Tell<M>, traceparent?: string): void {
    bus.unsafePublish(subject, this.encode(message), this.headers(message._tag, traceparent))
  }

  /** Asks the actor of `target`; its answer, its typed failure, or why there is none. */
  ask<Req extends Ask<M>>(from: Sender, target: Subjects.ConnId, request: Req, options?: AskOptions): Effect.Effect<Success<Req>, Failure<Req> | PeerTimeout | PeerUnavailable> {
    const route = from.route
    const timeout = options?.timeout === undefined ? DEFAULT_TIMEOUT : Duration.decode(options.timeout)
    const headers = this.headers(request._tag, options?.traceparent)
    return Effect.suspend(() => {
      const mailbox = route.local(target)
      if (mailbox === undefined) return this.request(route.bus, Subjects.conn(route.service, target), request, headers, timeout)
      const done = Deferred.unsafeMake<Success<Req>, Failure<Req>>(FiberId.none)
      const replyTo: ReplyTo = () => localReply(done) as never
      mailbox.offer(new LocalPeerMessage(route, target, headers, this, request, replyTo))
      return Deferred.await(done).pipe(
        Effect.timeoutFail({ duration: timeout, onTimeout: () => new PeerTimeout({ to: target, tag: request._tag, timeout }) })
      )
    })
  }

  /** Asks whoever serves `subject` (a service's queue group, see `serve`). */
  call<Req extends Ask<M>>(subject: string, request: Req, options?: AskOptions): Effect.Effect<Success<Req>, Failure<Req> | PeerTimeout | PeerUnavailable, Bus> {
    return Effect.flatMap(Bus, (bus) => this.callOn(bus, subject, request, options))
  }

  /** `call` on the bus given: for callers that hold it (the actor host, the edge, clients made in a layer). */
  callOn<Req extends Ask<M>>(bus: BusShape, subject: string, request: Req, options?: AskOptions): Effect.Effect<Success<Req>, Failure<Req> | PeerTimeout | PeerUnavailable> {
    const timeout = options?.timeout === undefined ? DEFAULT_TIMEOUT : Duration.decode(options.timeout)
    return this.request(bus, subject, request, this.headers(request._tag, options?.traceparent), timeout)
  }

  /**
   * `callOn` with a callback, for a handshake's hot paths: no fiber waits for the answer (see the
   * Bus port's `unsafeRequest`). `onExit` is called once, never before this returns; the function
   * returned cancels the call.
   */
  unsafeCallOn<Req extends Ask<M>>(
    bus: BusShape,
    subject: string,
    request: Req,
    options: AskOptions | undefined,
    onExit: (exit: Exit.Exit<Success<Req>, Failure<Req> | PeerTimeout | PeerUnavailable>) => void
  ): () => void {
    const timeout = options?.timeout === undefined ? DEFAULT_TIMEOUT : Duration.decode(options.timeout)
    // The callback keeps the tag and the class's exit codec, not the request: a handshake's
    // request (an edge's open, with its event and claims) would otherwise live until the answer.
    const tag = request._tag
    const codec = PeerExit.ofRequest(request)
    return bus.unsafeRequest(subject, this.encode(request), { headers: this.headers(tag, options?.traceparent), timeout }, (result) =>
      onExit(
        Either.isLeft(result)
          ? Exit.fail(peerFailure(result.left, subject, tag, timeout))
          : answerOf<Req>(result.right, subject, tag, codec)
      ))
  }

  private request<Req extends Ask<M>>(bus: BusShape, subject: string, request: Req, headers: Headers, timeout: Duration.Duration) {
    return bus.request(subject, this.encode(request), { headers, timeout }).pipe(
      Effect.mapError((e) => peerFailure(e, subject, request._tag, timeout)),
      Effect.flatMap((answer) => answerOf<Req>(answer, subject, request._tag, PeerExit.ofRequest(request)))
    )
  }

  /** Decodes a peer message from the bus; `Left` says why it is not one of this protocol's. */
  decode(message: BusMessage): Either.Either<M, string> {
    const tag = message.header(Subjects.Header.kind)
    const member = tag === undefined ? undefined : this.members.get(tag)
    if (member === undefined) return Either.left(`unknown peer message kind ${JSON.stringify(tag)}`)
    // Parsed with the depth bound every client frame gets: the bus is no trust boundary for shape,
    // and what comes after a parse (Schemas, JSON.stringify of a forwarded answer) recurses.
    const parsed = Json.parse(text(message), PEER_DEPTH)
    if (Either.isLeft(parsed)) return Either.left(`malformed ${tag}: ${parsed.left}`)
    const fast = member.decodeFast?.(parsed.right)
    if (fast !== undefined) return Either.right(fast)
    return Either.mapLeft(member.decode(parsed.right), (e) => `malformed ${tag}: ${e.message}`)
  }

  /** The reply to a request that came over the bus from an asker waiting at `subject`: what an adopter rebuilds after a hand-off. */
  replyAt<Req extends Ask<M>>(
    bus: BusShape,
    request: { readonly success: Schema.Schema.AnyNoContext; readonly failure: Schema.Schema.AnyNoContext; new(...args: never): Req },
    subject: string
  ): Reply<Req> {
    return remoteReply<Req>(bus, subject, PeerExit.ofClass(request))
  }

  /**
   * What an actor's mailbox does with a peer message: hands it to `receive` typed, as it came from
   * this replica or decoded from the bus. One that does not decode is logged and dropped.
   */
  inbox<R>(bus: BusShape, receive: (message: M, reply: ReplyTo) => Effect.Effect<void, never, R> | void) {
    return (message: BusMessage): Effect.Effect<void, never, R> | void => {
      // Only this protocol's tell and ask put these into its actors' mailboxes.
      if (message instanceof LocalPeerMessage) return receive(message.value as M, message.replyTo)
      const decoded = this.decode(message)
      if (Either.isLeft(decoded)) return Effect.logWarning(`peer: dropped a message on ${message.subject}: ${decoded.left}`)
      return receive(decoded.right, replyOver(bus, message.reply))
    }
  }

  /** Serves this protocol's requests on `subject` (a service's queue group) until the scope closes. */
  serve(
    subject: string,
    receive: (message: M, reply: ReplyTo) => Effect.Effect<void> | void,
    options?: { readonly queue?: string }
  ): Effect.Effect<Subscription, BusError, Bus | Scope.Scope> {
    return Effect.gen(this, function*() {
      const bus = yield* Bus
      const runFork = yield* FiberSet.makeRuntime<never>()
      const handle = this.inbox(bus, receive)
      return yield* bus.subscribe(subject, (m) => {
        const work = handle(m)
        if (work !== undefined) runFork(work)
      }, options)
    })
  }
}

/** Why an ask got no answer, from why its bus request did not. */
const peerFailure = (e: NoResponders | RequestTimeout | BusError, to: string, tag: string, timeout: Duration.Duration): PeerTimeout | PeerUnavailable => {
  switch (e._tag) {
    case "RequestTimeout":
      return new PeerTimeout({ to, tag, timeout })
    case "NoResponders":
      return new PeerUnavailable({ reason: "NoResponders", to, tag, cause: e })
    case "BusError":
      return new PeerUnavailable({ reason: "Bus", to, tag, cause: e })
  }
}

/** The answer to a `tag` request as its exit Schema decodes it; one that does not decode is `Malformed`. */
const answerOf = <Req extends Schema.TaggedRequest.All>(answer: BusMessage, to: string, tag: string, codec: PeerExit.ExitCodec): Exit.Exit<Success<Req>, Failure<Req> | PeerUnavailable> => {
  const exit = codec.decode(text(answer))
  if (Either.isLeft(exit)) return Exit.fail(new PeerUnavailable({ reason: "Malformed", to, tag, cause: exit.left }))
  return exit.right as Exit.Exit<Success<Req>, Failure<Req>>
}

const replyOver = (bus: BusShape, subject: string | undefined): ReplyTo =>
  subject === undefined ? noReply : (request) => remoteReply(bus, subject, PeerExit.ofRequest(request))

/**
 * Hand-written codecs of a protocol's hottest members, by tag (an edge's `Open`, sent per socket),
 * each tested against its Schema: an encoder in place of the Schema's, which must write what the
 * Schema writes; a decoder before the Schema's, which returns what the Schema would, or
 * `undefined` for the Schema to decode (and say why).
 */
export interface FastPaths<M extends Message> {
  readonly encode?: { readonly [K in M["_tag"]]?: (value: Extract<M, { readonly _tag: K }>) => string }
  readonly decode?: { readonly [K in M["_tag"]]?: (parsed: unknown) => Extract<M, { readonly _tag: K }> | undefined }
}

/**
 * A service's protocol, from its union of tagged classes and tagged requests (`Schema.Union` of
 * one member is that member itself).
 */
export const protocol = <A extends Message, I>(schema: Schema.Schema<A, I>, fast?: FastPaths<A>): Protocol<A> => {
  const members = "members" in schema ? schema.members : [schema]
  if (!Array.isArray(members) || !members.every((m): m is Member => Schema.isSchema(m))) {
    throw new Error("a peer protocol is a Schema.Union of tagged classes, tagged requests and tagged structs")
  }
  return new Protocol<A>(members, fast)
}
