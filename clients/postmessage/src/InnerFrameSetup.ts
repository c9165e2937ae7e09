/**
 * The setup phase from the embedded window, loaded with `#setup`: announce, learn the session id
 * and the asking origin, let the page do its setup (a form, an OAuth popup, or nothing), then
 * `complete()` with a title and the visibility the transport phase needs. An outer origin that is
 * not allowed is told so with an error `MCP_SETUP_COMPLETE`, and `handshake()` rejects.
 */
import { type InnerOptions, InnerLink } from "./internal/InnerLink.ts"
import type { Session } from "./Peer.ts"
import * as Messages from "./Messages.ts"
import { PostMessageError } from "./PostMessageError.ts"

export interface InnerFrameSetupOptions extends InnerOptions {
  /** Whether this page shows UI during setup; the outer frame then makes it visible. */
  readonly requiresVisibleSetup: boolean
}

export interface SetupSuccess {
  readonly serverTitle: string
  readonly transportVisibility: Messages.TransportVisibility
  readonly ephemeralMessage?: string
}

const refusedVisibility: Messages.TransportVisibility = { requirement: "hidden" }

export class InnerFrameSetup {
  private readonly link: InnerLink
  private done = false

  constructor(private readonly options: InnerFrameSetupOptions) {
    this.link = new InnerLink(options, "setup", {
      onMessage: () => undefined,
      onRefusal: () => undefined,
      refusal: (origin) => ({
        type: "MCP_SETUP_COMPLETE",
        status: "error",
        serverTitle: "",
        transportVisibility: refusedVisibility,
        error: { code: "CONFIG_ERROR", message: `${origin} is not allowed to use this server` }
      })
    })
  }

  /** Who is asking, under which session id: what the page shows and scopes its storage by. */
  handshake(): Promise<Session> {
    return this.link.run({
      type: "MCP_SETUP_HANDSHAKE",
      protocolVersion: Messages.PROTOCOL_VERSION,
      minProtocolVersion: Messages.PROTOCOL_VERSION,
      maxProtocolVersion: Messages.PROTOCOL_VERSION,
      requiresVisibleSetup: this.options.requiresVisibleSetup
    })
  }

  async complete(result: SetupSuccess): Promise<void> {
    await this.finish({ type: "MCP_SETUP_COMPLETE", status: "success", ...result })
  }

  async fail(code: Messages.SetupErrorCode, message: string, serverTitle = ""): Promise<void> {
    await this.finish({
      type: "MCP_SETUP_COMPLETE",
      status: "error",
      serverTitle,
      transportVisibility: refusedVisibility,
      error: { code, message }
    })
  }

  private async finish(message: Messages.SetupComplete): Promise<void> {
    await this.handshake()
    if (this.done) throw new PostMessageError({ reason: "Closed", message: "setup was already completed" })
    this.done = true
    this.link.post({ ...message, displayName: message.serverTitle })
    this.link.close()
  }
}
