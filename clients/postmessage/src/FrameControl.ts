/**
 * How the outer frame drives the window it talks to: an iframe it puts in the page, or a popup it
 * opens. Each `navigate` loads a fresh document (a new iframe, a new popup), as the spec asks of
 * the transport phase, and because `#setup` → base URL in the same iframe would otherwise be a
 * mere fragment change for some URLs.
 */
import { PostMessageError } from "./PostMessageError.ts"
import type { PeerWindow } from "./Peer.ts"

export interface FrameControl {
  /** Loads `url` into a fresh window, replacing any earlier one. */
  navigate(url: string): void
  /** The current window: what `event.source` is compared with and what messages are posted to. */
  readonly window: PeerWindow | null
  setVisible(visible: boolean): void
  /** Removes the iframe or closes the popup. */
  close(): void
  /** Calls `listener` once if the window goes away by itself (a user closes the popup); returns a stop. */
  onClosed?(listener: () => void): () => void
}

export interface IframeControlOptions {
  /** Where the iframe goes. */
  readonly container: HTMLElement
  /** Extra attributes for each iframe, such as `title` or `allow`; a `sandbox` here replaces the default. */
  readonly attributes?: Readonly<Record<string, string>>
  /** How visibility is shown; by default the iframe's `hidden` attribute. */
  readonly setVisible?: (iframe: HTMLIFrameElement, visible: boolean) => void
}

/**
 * The sandbox every iframe gets unless told otherwise, as the spec advises: the server may run
 * scripts, keep its own storage (its origin stays its own, which the allow-lists need: a sandboxed
 * origin is "null") and open popups, but never navigate this page.
 */
export const DEFAULT_SANDBOX = "allow-scripts allow-same-origin allow-forms allow-popups"

export class IframeControl implements FrameControl {
  private iframe: HTMLIFrameElement | null = null
  private visible = false

  constructor(private readonly options: IframeControlOptions) {}

  /** The current iframe element, for styling. */
  get element(): HTMLIFrameElement | null {
    return this.iframe
  }

  get window(): PeerWindow | null {
    return this.iframe?.contentWindow ?? null
  }

  navigate(url: string): void {
    this.close()
    const iframe = this.options.container.ownerDocument.createElement("iframe")
    for (const [name, value] of Object.entries({ sandbox: DEFAULT_SANDBOX, ...this.options.attributes })) iframe.setAttribute(name, value)
    this.iframe = iframe
    this.show()
    iframe.src = url
    this.options.container.appendChild(iframe)
  }

  setVisible(visible: boolean): void {
    this.visible = visible
    this.show()
  }

  close(): void {
    this.iframe?.remove()
    this.iframe = null
  }

  private show(): void {
    if (this.iframe === null) return
    if (this.options.setVisible !== undefined) this.options.setVisible(this.iframe, this.visible)
    else this.iframe.hidden = !this.visible
  }
}

export interface PopupControlOptions {
  /** The window that opens the popup; `window` by default. */
  readonly opener?: Pick<Window, "open">
  /** `window.open` features; a popup of 480×640 by default. */
  readonly features?: string
}

export class PopupControl implements FrameControl {
  private popup: Window | null = null

  constructor(private readonly options: PopupControlOptions = {}) {}

  get window(): PeerWindow | null {
    return this.popup !== null && !this.popup.closed ? this.popup : null
  }

  /** Opens the popup. Browsers block popups not opened from a user gesture: call this from one. */
  navigate(url: string): void {
    this.close()
    const opener = this.options.opener ?? window
    // Never `noopener`: the inner frame finds us through `window.opener`.
    this.popup = opener.open(url, "_blank", this.options.features ?? "popup,width=480,height=640")
    if (this.popup === null) throw new PostMessageError({ reason: "NoPeerWindow", message: `the popup for ${url} was blocked` })
  }

  /** A popup is a window of its own; showing it means bringing it to the front. */
  setVisible(visible: boolean): void {
    if (visible) this.popup?.focus()
  }

  close(): void {
    this.popup?.close()
    this.popup = null
  }

  /** Polled: a cross-origin popup's closing fires no event the opener can hear. */
  onClosed(listener: () => void): () => void {
    const popup = this.popup
    const timer = setInterval(() => {
      if (popup !== null && !popup.closed) return
      clearInterval(timer)
      listener()
    }, 250)
    return () => clearInterval(timer)
  }
}
