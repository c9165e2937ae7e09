import type { SourceMapPayload } from "node:module"

/** The map with only the mappings, and the sources' text, of the sources `keep` accepts (see sourceMaps.mjs). */
export declare const keepMappings: (map: SourceMapPayload, keep: (source: string) => boolean) => SourceMapPayload
/** A module of the project itself, not one of node_modules. */
export declare const ownSource: (source: string) => boolean
