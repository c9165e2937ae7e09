/**
 * The `chrome.storage` keys of the extension's settings (documented in the README): in `local`,
 * or set by policy in `managed`. Apart from everything else so that a test harness can import
 * them without the chrome types.
 */
export const Keys = {
  serverUrl: "switchboard.serverUrl",
  token: "switchboard.token",
  /** Generated once per profile, so the proxy gives this browser the same extension_id every time. */
  clientId: "switchboard.clientId",
  /** The name shown in list_extensions; defaults to "Chrome <major version>". */
  name: "switchboard.name"
} as const
