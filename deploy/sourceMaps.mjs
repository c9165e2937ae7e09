// What a bundle's source map keeps: the mappings of the project's own modules, not of its
// dependencies. Node, run with --enable-source-maps as the images run the services, decodes every
// mapping of a bundle into an array of its own when the bundle loads, and keeps them, and the map
// with the sources' text, for the life of the process: the all-in-one's heap was 80 MB after a GC,
// against 25 MB without the map (390,000 mappings, and 12 MB of sources). Almost
// all of those mappings point into node_modules (Effect's own .ts sources, through its packages'
// maps), where a stack frame read from the bundle's line is as useful as a mapped one.
// A run of a dependency's mappings becomes one mapping with no source: a frame there is printed
// with its place in the bundle, and no mapping of the project's code before it stretches over it.

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
const DIGIT = new Map([...BASE64].map((c, i) => [c, i]))

/** The numbers of one segment, as Base64 VLQ writes them. */
const decodeSegment = (text) => {
  const out = []
  let value = 0
  let shift = 0
  for (const c of text) {
    const digit = DIGIT.get(c)
    if (digit === undefined) throw new Error(`not a Base64 VLQ digit: ${JSON.stringify(c)}`)
    value += (digit & 31) << shift
    if (digit & 32) {
      shift += 5
      continue
    }
    out.push(value & 1 ? -(value >>> 1) : value >>> 1)
    value = 0
    shift = 0
  }
  return out
}

const encodeNumber = (n) => {
  let value = n < 0 ? (-n << 1) | 1 : n << 1
  let out = ""
  do {
    let digit = value & 31
    value >>>= 5
    if (value > 0) digit |= 32
    out += BASE64[digit]
  } while (value > 0)
  return out
}

/**
 * The map with only the mappings, and the sources' text, of the sources `keep` accepts; the others
 * become source-less mappings, one per run. `sources` and `names` keep their places, so that
 * indices still match.
 */
export const keepMappings = (map, keep) => {
  const kept = map.sources.map((source) => keep(source))
  // Absolute values of the fields that are relative across lines, as read and as written.
  const read = [0, 0, 0, 0]
  const written = [0, 0, 0, 0]
  const lines = map.mappings.split(";").map((line) => {
    let column = 0
    let writtenColumn = 0
    let dropping = false
    const out = []
    for (const text of line.split(",")) {
      if (text === "") continue
      const fields = decodeSegment(text)
      column += fields[0]
      for (let i = 1; i < fields.length; i++) read[i - 1] += fields[i]
      const own = fields.length >= 4 && kept[read[0]]
      if (!own && dropping) continue
      dropping = !own
      let segment = encodeNumber(column - writtenColumn)
      writtenColumn = column
      if (own) {
        for (let i = 1; i < fields.length; i++) {
          segment += encodeNumber(read[i - 1] - written[i - 1])
          written[i - 1] = read[i - 1]
        }
      }
      out.push(segment)
    }
    return out.join(",")
  })
  const sourcesContent = map.sourcesContent?.map((content, i) => (kept[i] ? content : null))
  return { ...map, mappings: lines.join(";"), ...(sourcesContent === undefined ? {} : { sourcesContent }) }
}

/** A module of the project itself, not one of node_modules. */
export const ownSource = (source) => !source.split(/[\\/]/).includes("node_modules")
