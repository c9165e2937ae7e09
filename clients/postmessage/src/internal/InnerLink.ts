/**
 * The inner frame's side of either handshake: announce itself to `'*'` (the only message ever sent
 * there; repeated until answered, since the outer frame may listen only after `load`), wait for the reply from an allowed origin through the parent or opener window, pin that
 * origin. A reply on a pinned link is refused, so a replayed or second handshake changes nothing.
 */
import * as Option from "effect/Option"
import type { ProtocolMessage } from "../Messages.ts"
import * as Messages from "../Messages.ts"
import { type MessageHost, Peer, type PeerWindow, type Session } from "../Peer.ts"
import { asError, PostMessageError } from "../PostMessageError.ts"
import { Deadline } from "./Deadline.ts"
import { DEFAULT_ANNOUNCE_EVERY_MS, DEFAULT_HANDSHAKE_TIMEOUT_MS, type Phase, replyType, versionProblem } from "./Phases.ts"

export interface InnerOptions {
  /** Outer origins that may use this frame. Required: `['*']` lets any site in (demos only). */
  readonly allowedOrigins: ReadonlyArray<string>
  /** How long to wait for the outer frame's reply. */
  readonly handshakeTimeoutMs?: number
  /** How often the handshake is repeated while unanswered (within `handshakeTimeoutMs`). */
  readonly announceEveryMs?: number
  /** The window to listen on; the global `window` by default. */
  readonly host?: MessageHost
  /** The outer window; by default `window.parent` in an iframe, `window.opener` in a popup. */
  readonly outer?: PeerWindow
}


const defaultOuter = (): PeerWindow | null => window.parent !== window ? window.parent : window.opener as Window | null

export class InnerLink {
  readonly handshake = new Deadline<Session>()
  private readonly peer: Peer
  private started = false
  private announced = 0
  private accepted: Session | undefined
  /** Answers to our repeated handshakes that may still arrive after the one we accepted. */
  private echoes = 0

  constructor(
    private readonly options: InnerOptions,
    private readonly phase: Phase,
    private readonly handlers: {
      /** A message other than the reply, after the handshake. */
      readonly onMessage: (message: ProtocolMessage) => void
      readonly onRefusal: (error: PostMessageError) => void
      /** The outer window's origin is not allowed: the refusal, to be told to that origin. */
      readonly refusal: (origin: string) => ProtocolMessage
    }
  ) {
    const outer = options.outer ?? defaultOuter()
    this.peer = new Peer({
      host: options.host ?? window,
      window: () => outer,
      allowedOrigins: options.allowedOrigins,
      onMessage: (message, origin) => this.receive(message, origin),
      onRefused: (data, origin) => this.refused(data, origin)
    })
  }

  get origin(): string | undefined {
    return this.peer.origin
  }

  /** Announces this frame and waits for the reply; once only, later calls share the first. */
  run(handshake: Messages.SetupHandshake | Messages.TransportHandshake): Promise<Session> {
    if (this.started) return this.handshake.promise
    this.started = true
    const timeoutMs = this.options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS
    this.handshake.arm(timeoutMs, () =>
      new PostMessageError({ reason: "HandshakeTimeout", message: `no ${replyType(this.phase)} within ${timeoutMs} ms` }))
    this.peer.listen()
    const announce = () => {
      try {
        this.peer.announce(handshake)
        this.announced++
      } catch (error) {
        this.handshake.reject(asError(error))
      }
    }
    announce()
    // Until answered, or the deadline: an outer frame may start listening only after our `load`.
    const repeat = setInterval(announce, this.options.announceEveryMs ?? DEFAULT_ANNOUNCE_EVERY_MS)
    const stop = () => clearInterval(repeat)
    this.handshake.promise.then(stop, stop)
    return this.handshake.promise
  }

  post(message: ProtocolMessage): void {
    this.peer.post(message)
  }

  close(): void {
    this.handshake.reject(new PostMessageError({ reason: "Closed", message: "closed before the handshake" }))
    this.peer.close()
  }

  private receive(message: ProtocolMessage, origin: string): void {
    if (message.type === "MCP_SETUP_HANDSHAKE_REPLY" || message.type === "MCP_TRANSPORT_HANDSHAKE_REPLY") {
      this.accept(message, origin)
    } else if (this.peer.origin !== undefined) {
      this.handlers.onMessage(message)
    }
  }

  private accept(message: Messages.SetupHandshakeReply | Messages.TransportHandshakeReply, origin: string): void {
    // An outer frame may answer each of our repeated handshakes that reached it before our first
    // answer did: as many copies of that answer as we sent extra handshakes are no second handshake.
    if (this.accepted !== undefined && this.echoes > 0 && origin === this.accepted.origin &&
      message.type === replyType(this.phase) && message.sessionId === this.accepted.sessionId) {
      this.echoes--
      return
    }
    if (this.peer.origin !== undefined || !this.handshake.pending) {
      this.handlers.onRefusal(new PostMessageError({ reason: "SecondHandshake", message: `refused a second ${message.type} from ${origin}` }))
      return
    }
    if (message.type !== replyType(this.phase)) return
    const problem = versionProblem(message.protocolVersion)
    if (problem !== undefined) {
      this.handshake.reject(new PostMessageError({ reason: "UnsupportedVersion", message: problem }))
      return
    }
    this.peer.pin(origin)
    this.accepted = { sessionId: message.sessionId, origin }
    this.echoes = this.announced - 1
    this.handshake.resolve(this.accepted)
  }

  /** Only the reply to our own handshake earns the refusal an answer; anything else is dropped. */
  private refused(data: unknown, origin: string): void {
    if (!this.handshake.pending || this.peer.origin !== undefined) return
    const reply = Messages.decode(data)
    if (Option.isNone(reply) || reply.value.type !== replyType(this.phase)) return
    const error = new PostMessageError({ reason: "OriginNotAllowed", message: `${origin} is not allowed to use this frame` })
    this.peer.refuse(this.handlers.refusal(origin), origin)
    this.handlers.onRefusal(error)
    this.handshake.reject(error)
  }
}
