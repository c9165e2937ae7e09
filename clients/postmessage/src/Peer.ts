/**
 * The link to the one window on the other side: only `event.source` and `event.origin` are
 * trusted. Before the handshake pins an origin, messages pass from allowed origins only; after,
 * from the pinned origin only, and everything sent goes to it. `'*'` is reachable only through
 * `announce`, which the inner frame uses for its first handshake message.
 */
import * as Option from "effect/Option"
import { decode, type ProtocolMessage, type SetupHandshake, type TransportHandshake } from "./Messages.ts"
import { PostMessageError } from "./PostMessageError.ts"

/** What a `message` event offers; the fields a real `MessageEvent` has and a test can fake. */
export interface Arrival {
  readonly data: unknown
  readonly origin: string
  readonly source: unknown
}

/** The window this side listens on (its own `window`). */
export interface MessageHost {
  addEventListener(type: "message", listener: (event: Arrival) => void): void
  removeEventListener(type: "message", listener: (event: Arrival) => void): void
}

/** The other side's window: an iframe's `contentWindow`, a popup, `window.parent` or `window.opener`. */
export interface PeerWindow {
  postMessage(message: unknown, targetOrigin: string): void
}

/** Who a handshake pinned: the session id the outer frame chose, and the outer or inner origin. */
export interface Session {
  readonly sessionId: string
  readonly origin: string
}

/** `'*'` in an allow-list lets every origin in: for demos only, as the spec warns. */
export const isAllowed = (allowedOrigins: ReadonlyArray<string>, origin: string): boolean =>
  allowedOrigins.includes(origin) || allowedOrigins.includes("*")

export interface PeerOptions {
  readonly host: MessageHost
  /** Read on every event, since an outer frame's window changes when it navigates a new frame. */
  readonly window: () => PeerWindow | null
  readonly allowedOrigins: ReadonlyArray<string>
  readonly onMessage: (message: ProtocolMessage, origin: string) => void
  /** A message from the peer window but from an origin that is neither allowed nor pinned. */
  readonly onRefused?: (data: unknown, origin: string) => void
}

export class Peer {
  private pinnedOrigin: string | undefined
  private readonly listener = (event: Arrival) => this.receive(event)
  private listening = false

  constructor(private readonly options: PeerOptions) {}

  get origin(): string | undefined {
    return this.pinnedOrigin
  }

  listen(): void {
    if (this.listening) return
    this.listening = true
    this.options.host.addEventListener("message", this.listener)
  }

  close(): void {
    if (!this.listening) return
    this.listening = false
    this.options.host.removeEventListener("message", this.listener)
  }

  /** From now on, only `origin` is heard and written to. A pin is never moved. */
  pin(origin: string): void {
    if (this.pinnedOrigin !== undefined && this.pinnedOrigin !== origin) {
      throw new PostMessageError({ reason: "SecondHandshake", message: `already pinned to ${this.pinnedOrigin}` })
    }
    this.pinnedOrigin = origin
  }

  /** The inner frame's first handshake message, before it knows who frames it. */
  announce(message: SetupHandshake | TransportHandshake): void {
    if (this.pinnedOrigin !== undefined) {
      throw new PostMessageError({ reason: "SecondHandshake", message: "a pinned peer is never written to '*'" })
    }
    this.target().postMessage(message, "*")
  }

  /** Writes to the pinned origin; there is no other way to write once a handshake has begun. */
  post(message: ProtocolMessage): void {
    if (this.pinnedOrigin === undefined) {
      throw new PostMessageError({ reason: "Closed", message: "no origin is pinned yet" })
    }
    this.target().postMessage(message, this.pinnedOrigin)
  }

  /** Tells a refused origin why, addressed to that origin only (never `'*'`). */
  refuse(message: ProtocolMessage, origin: string): void {
    this.target().postMessage(message, origin)
  }

  private target(): PeerWindow {
    const peer = this.options.window()
    if (peer === null) throw new PostMessageError({ reason: "NoPeerWindow", message: "the peer window is gone" })
    return peer
  }

  private receive(event: Arrival): void {
    const peer = this.options.window()
    if (peer === null || event.source !== peer) return
    const admitted = this.pinnedOrigin === undefined
      ? isAllowed(this.options.allowedOrigins, event.origin)
      : event.origin === this.pinnedOrigin
    if (!admitted) {
      this.options.onRefused?.(event.data, event.origin)
      return
    }
    const message = decode(event.data)
    if (Option.isSome(message)) this.options.onMessage(message.value, event.origin)
  }
}
