/**
 * The outer frame's side of either handshake: load the inner frame, wait for its handshake from
 * an allowed origin, pin that origin, reply. A handshake on a pinned link is refused, whoever
 * sends it. What comes after the handshake is the caller's (setup or transport).
 */
import type { FrameControl } from "../FrameControl.ts"
import type { ProtocolMessage } from "../Messages.ts"
import type * as Messages from "../Messages.ts"
import { type MessageHost, Peer } from "../Peer.ts"
import { asError, PostMessageError } from "../PostMessageError.ts"
import { Deadline } from "./Deadline.ts"
import { DEFAULT_HANDSHAKE_TIMEOUT_MS, handshakeType, negotiate, type Phase, phaseUrl } from "./Phases.ts"

export interface OuterOptions {
  /** The inner frame's URL, without `#setup`; the phase adds or removes the hash. */
  readonly serverUrl: string
  /** Chosen by the outer frame; the inner frame scopes what it stores by it. */
  readonly sessionId: string
  /** Origins the inner frame may answer from; by default only the origin of `serverUrl`. */
  readonly allowedOrigins?: ReadonlyArray<string>
  /** How long each handshake step may take. */
  readonly handshakeTimeoutMs?: number
  /** The window to listen on; the global `window` by default. */
  readonly host?: MessageHost
}

export type Handshake = Messages.SetupHandshake | Messages.TransportHandshake

export class OuterLink {
  /** Settled when the inner frame's handshake has been accepted and answered. */
  readonly handshake = new Deadline<Handshake>()
  private readonly peer: Peer
  private repeatsInFlight = false
  readonly timeoutMs: number

  constructor(
    private readonly frame: FrameControl,
    private readonly options: OuterOptions,
    private readonly phase: Phase,
    private readonly handlers: {
      /** A message other than the handshake, after the handshake. */
      readonly onMessage: (message: ProtocolMessage) => void
      /** Something refused that the application may want to know about. */
      readonly onRefusal: (error: PostMessageError) => void
    }
  ) {
    this.timeoutMs = options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS
    this.peer = new Peer({
      host: options.host ?? window,
      window: () => frame.window,
      allowedOrigins: options.allowedOrigins ?? [new URL(options.serverUrl).origin],
      onMessage: (message, origin) => this.receive(message, origin)
    })
  }

  /** The inner frame's origin, once pinned. */
  get origin(): string | undefined {
    return this.peer.origin
  }

  get url(): string {
    return phaseUrl(this.options.serverUrl, this.phase)
  }

  open(): void {
    this.peer.listen()
    this.handshake.arm(this.timeoutMs, () =>
      new PostMessageError({
        reason: "HandshakeTimeout",
        message: `no ${handshakeType(this.phase)} from ${this.url} within ${this.timeoutMs} ms`
      }))
    try {
      this.frame.navigate(this.url)
    } catch (error) {
      this.handshake.reject(asError(error))
    }
  }

  post(message: ProtocolMessage): void {
    this.peer.post(message)
  }

  close(): void {
    this.handshake.reject(new PostMessageError({ reason: "Closed", message: "closed before the handshake" }))
    this.peer.close()
  }

  private receive(message: ProtocolMessage, origin: string): void {
    if (message.type === "MCP_SETUP_HANDSHAKE" || message.type === "MCP_TRANSPORT_HANDSHAKE") {
      // The inner frame repeats its handshake until answered: repeats it sent before our answer
      // reached it may still arrive. Once it has said anything else, a handshake is a second one.
      if (this.repeatsInFlight && message.type === handshakeType(this.phase)) return
      this.answer(message, origin)
    } else if (this.peer.origin !== undefined) {
      this.repeatsInFlight = false
      this.handlers.onMessage(message)
    }
  }

  private answer(message: Handshake, origin: string): void {
    if (this.peer.origin !== undefined || !this.handshake.pending) {
      this.handlers.onRefusal(new PostMessageError({ reason: "SecondHandshake", message: `refused a second ${message.type} from ${origin}` }))
      return
    }
    if (message.type !== handshakeType(this.phase)) return
    const negotiated = negotiate(message)
    if ("problem" in negotiated) {
      this.handshake.reject(new PostMessageError({ reason: "UnsupportedVersion", message: negotiated.problem }))
      return
    }
    this.peer.pin(origin)
    const { sessionId } = this.options
    const { version } = negotiated
    this.peer.post(
      message.type === "MCP_SETUP_HANDSHAKE"
        ? { type: "MCP_SETUP_HANDSHAKE_REPLY", protocolVersion: version, sessionId }
        : { type: "MCP_TRANSPORT_HANDSHAKE_REPLY", protocolVersion: version, sessionId }
    )
    this.repeatsInFlight = true
    this.handshake.resolve(message)
  }
}
