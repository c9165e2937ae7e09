/**
 * Switchboard's CDP endpoint (`/cdp/{extension_id}`) as the extension sees it: the methods the
 * router sends on `/extension` for a CDP client, and the one notification the extension sends
 * back. The seed MCP Proxy Protocol has `forwardCDPCommand` but no way for an extension to send
 * CDP events; `forwardCDPEvent` is Switchboard's extension of the protocol. An extension that
 * does not know these methods answers them "Method not found", and keeps working for every other
 * client. Plain types, no effect: the extension's bundle imports this.
 */

export const Method = {
  /** Attach the debugger to a tab for one CDP client and start sending its events: `AttachParams` → `TargetInfo`. */
  attach: "cdpAttach",
  /** Stop sending a tab's events to that client and detach the debugger: `DetachParams` → `{}`. */
  detach: "cdpDetach",
  /** One CDP command in a tab (or a child session of it): `CommandParams` → the CDP result. */
  command: "forwardCDPCommand",
  /** Extension → router notification: `EventParams`. */
  event: "forwardCDPEvent"
} as const

export interface AttachParams {
  readonly tabId: number
  /** The proxy connection of the CDP client: its events go only to it. */
  readonly connection_id: string
}

export interface DetachParams {
  readonly tabId: number
  readonly connection_id: string
}

export interface CommandParams {
  readonly tabId: number
  readonly method: string
  readonly params?: Record<string, unknown>
  /** A child target's session (an iframe, a worker), as Chrome named it in `Target.attachedToTarget`. */
  readonly sessionId?: string
}

export interface EventParams {
  readonly connection_id: string
  readonly tabId: number
  /** Set for an event of a child target's session. */
  readonly sessionId?: string
  readonly method: string
  readonly params?: Record<string, unknown>
}

/** A page target as CDP's `Target.TargetInfo` describes it. */
export interface TargetInfo {
  readonly targetId: string
  readonly type: string
  readonly title: string
  readonly url: string
  readonly attached: boolean
  readonly canAccessOpener: boolean
  readonly browserContextId?: string
}

/**
 * What the extension sends when the debugger left a tab (closed, or the user cancelled it): CDP's
 * own `Inspector.detached`, with its reason.
 */
export const Detached = "Inspector.detached"
