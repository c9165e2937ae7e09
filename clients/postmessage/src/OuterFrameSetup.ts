/**
 * The setup phase from the outer frame: load `serverUrl#setup`, answer the handshake with the
 * session id, show the frame if the server asks for a visible setup, and wait for
 * `MCP_SETUP_COMPLETE`. The result (title, transport visibility) is for the application to keep
 * next to the session id; the frame is closed afterwards, since the transport phase loads a new one.
 */
import type { FrameControl } from "./FrameControl.ts"
import { Deadline } from "./internal/Deadline.ts"
import { type OuterOptions, OuterLink } from "./internal/OuterLink.ts"
import type { SetupComplete, Visibility } from "./Messages.ts"
import { PostMessageError } from "./PostMessageError.ts"

export interface OuterFrameSetupOptions extends OuterOptions {
  /** How long the setup may take after the handshake, user interaction included; 5 minutes by default. */
  readonly setupTimeoutMs?: number
  /** Told whether the server asked for a visible setup, before the frame is shown. */
  readonly onHandshake?: (requiresVisibleSetup: boolean) => void
}

const DEFAULT_SETUP_TIMEOUT_MS = 5 * 60_000

/**
 * Runs the setup phase in `frame`. Resolves with the server's `MCP_SETUP_COMPLETE`, whose
 * `status` may be `error` (its `error.code` says why); rejects if the handshake or setup times out.
 */
export const runSetup = async (frame: FrameControl, options: OuterFrameSetupOptions): Promise<SetupComplete> => {
  const complete = new Deadline<SetupComplete>()
  const link = new OuterLink(frame, options, "setup", {
    onMessage: (message) => {
      if (message.type === "MCP_SETUP_COMPLETE") complete.resolve(message)
    },
    onRefusal: () => undefined
  })
  frame.setVisible(false)
  link.open()
  try {
    const handshake = await link.handshake.promise
    const requiresVisibleSetup = handshake.type === "MCP_SETUP_HANDSHAKE" && handshake.requiresVisibleSetup
    options.onHandshake?.(requiresVisibleSetup)
    if (requiresVisibleSetup) frame.setVisible(true)
    const timeoutMs = options.setupTimeoutMs ?? DEFAULT_SETUP_TIMEOUT_MS
    complete.arm(timeoutMs, () =>
      new PostMessageError({ reason: "SetupTimeout", message: `no MCP_SETUP_COMPLETE from ${link.url} within ${timeoutMs} ms` }))
    return await complete.promise
  } finally {
    link.close()
    frame.close()
  }
}

/**
 * Whether to show the frame in the transport phase: `required` always, `hidden` never, `optional`
 * as the user chose.
 */
export const transportVisible = (requirement: Visibility, userWantsVisible = false): boolean =>
  requirement === "required" || (requirement === "optional" && userWantsVisible)
