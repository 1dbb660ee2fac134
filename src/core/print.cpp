// print.cpp — Tensor::str(): PyTorch's printing (torch/_tensor_str.py with its default options: precision 4,
// summary beyond 1000 elements with 3 at each edge, 80 columns), so that ferry and PyTorch print the same tensor
// the same way. One formatter per tensor picks the notation from the values shown: whole numbers as "2.", a wide
// range or tiny values in scientific notation ("1.0000e-05"), else fixed with 4 decimals; every element is padded
// to one width.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/autograd.h"
#include "ferry/tensor.h"
#include "internal.h"

namespace ferry {

namespace {
constexpr int kPrecision = 4;
constexpr std::int64_t kThreshold = 1000;  // more elements than this: summarise
constexpr std::int64_t kEdgeItems = 3;
constexpr std::size_t kLineWidth = 80;

// The host values of a tensor in the widest type of its kind: int64 stays exact beyond 2^53.
struct HostValues {
  DType dtype;
  std::vector<double> floats;
  std::vector<std::int64_t> ints;
  std::vector<bool> bools;
};

std::string printf_string(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

class Formatter {
 public:
  // `shown`: the flat positions of the elements that will be printed.
  Formatter(const HostValues& v, const std::vector<std::int64_t>& shown) : values_(v) {
    floating_ = is_floating(v.dtype);
    if (!floating_) {
      for (std::int64_t i : shown) width_ = std::max(width_, raw(i).size());
      return;
    }
    double lo = 0, hi = 0;
    bool any = false;
    for (std::int64_t i : shown) {
      const double x = v.floats[static_cast<std::size_t>(i)];
      if (!std::isfinite(x) || x == 0) continue;
      const double a = std::abs(x);
      lo = any ? std::min(lo, a) : a;
      hi = any ? std::max(hi, a) : a;
      any = true;
      if (x != std::ceil(x)) int_mode_ = false;
    }
    if (!any) return;  // nothing but zeros, NaN and inf: "0.", "nan", "inf"
    sci_mode_ = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode_ && lo < 1.0e-4);
    for (std::int64_t i : shown) {
      const double x = v.floats[static_cast<std::size_t>(i)];
      if (!std::isfinite(x) || x == 0) continue;
      width_ = std::max(width_, raw(i).size());
    }
  }

  std::size_t width() const { return width_; }

  std::string format(std::int64_t i) const {
    std::string text = raw(i);
    if (text.size() < width_) text.insert(0, width_ - text.size(), ' ');
    return text;
  }

 private:
  std::string raw(std::int64_t i) const {
    const auto at = static_cast<std::size_t>(i);
    if (values_.dtype == DType::Bool) return values_.bools[at] ? "True" : "False";
    if (!floating_) return std::to_string(values_.ints[at]);
    const double x = values_.floats[at];
    if (std::isnan(x)) return "nan";  // not printf's "-nan"
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (sci_mode_) return printf_string("%.4e", x);
    if (int_mode_) return printf_string("%.0f", x) + ".";
    return printf_string("%.4f", x);
  }

  const HostValues& values_;
  bool floating_ = false, int_mode_ = true, sci_mode_ = false;
  std::size_t width_ = 1;
};

// Walks the elements a (possibly summarised) print shows: each dim keeps its first and last kEdgeItems when
// summarising and the dim is longer than twice that.
void shown_positions(const Shape& shape, const std::vector<std::int64_t>& strides, std::size_t dim, std::int64_t base,
                     bool summarize, std::vector<std::int64_t>& out) {
  const std::int64_t n = shape[dim];
  for (std::int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
    const std::int64_t at = base + i * strides[dim];
    if (dim + 1 == shape.size()) out.push_back(at);
    else shown_positions(shape, strides, dim + 1, at, summarize, out);
  }
}

std::string tensor_text(const Formatter& f, const Shape& shape, const std::vector<std::int64_t>& strides,
                        std::size_t dim, std::int64_t base, std::size_t indent, bool summarize) {
  const std::int64_t n = shape[dim];
  const bool cut = summarize && n > 2 * kEdgeItems;
  std::vector<std::string> parts;
  for (std::int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdgeItems) {
      parts.emplace_back(dim + 1 == shape.size() ? " ..." : "...");
      i = n - kEdgeItems;
    }
    const std::int64_t at = base + i * strides[dim];
    parts.push_back(dim + 1 == shape.size() ? f.format(at)
                                            : tensor_text(f, shape, strides, dim + 1, at, indent + 1, summarize));
  }
  std::string out = "[";
  if (dim + 1 == shape.size()) {  // a row: as many elements per line as fit in 80 columns
    const std::size_t per_line = std::max<std::size_t>(1, (kLineWidth - std::min(indent, kLineWidth)) / (f.width() + 2));
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) out += i % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
      out += parts[i];
    }
  } else {  // blocks: one line apart per dim below (a blank line between 2-d blocks of a 3-d tensor)
    const std::string separator = "," + std::string(shape.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? separator : "") + parts[i];
  }
  return out + "]";
}

// ", suffix" after the text, or on a new line when the last line would pass 80 columns (PyTorch's _add_suffixes).
std::string with_suffixes(std::string text, const std::vector<std::string>& suffixes, std::size_t indent) {
  const std::size_t newline = text.rfind('\n');
  std::size_t last_line = newline == std::string::npos ? text.size() + 2 : text.size() - newline + 1;
  for (const std::string& suffix : suffixes) {
    if (last_line + suffix.size() + 2 > kLineWidth) {
      text += ",\n" + std::string(indent, ' ') + suffix;
      last_line = indent + suffix.size();
    } else {
      text += ", " + suffix;
      last_line += suffix.size() + 2;
    }
  }
  return text + ")";
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const std::size_t indent = prefix.size();
  const Tensor host = detail::host_copy(detach(), "print");  // detached: the copies below build no graph nodes
  HostValues values{dtype(), {}, {}, {}};
  if (dtype() == DType::Bool) values.bools = host.to_vector<bool>();
  else if (is_floating(dtype())) values.floats = host.to(DType::Float64).to_vector<double>();
  else values.ints = host.to(DType::Int64).to_vector<std::int64_t>();

  std::vector<std::string> suffixes;
  if (!device().is_cpu()) suffixes.push_back("device='" + device().str() + "'");
  std::string text;
  if (numel() == 0) {
    text = "[]";
    if (dim() != 1) {
      std::string size = "size=(";
      for (int d = 0; d < dim(); ++d) size += (d > 0 ? ", " : "") + std::to_string(shape()[d]);
      suffixes.push_back(size + (dim() == 1 ? ",)" : ")"));
    }
    if (dtype() != DType::Float32) suffixes.push_back("dtype=" + std::string(dtype_name(dtype())));
  } else {
    const bool summarize = numel() > kThreshold;
    const std::vector<std::int64_t> strides = contiguous_strides(shape());
    std::vector<std::int64_t> shown;
    if (dim() == 0) shown.push_back(0);
    else shown_positions(shape(), strides, 0, 0, summarize, shown);
    const Formatter formatter(values, shown);
    if (dim() == 0) {
      text = formatter.format(0);
      const std::size_t pad = text.find_first_not_of(' ');
      text = text.substr(pad == std::string::npos ? 0 : pad);  // a scalar is not padded
    } else {
      text = tensor_text(formatter, shape(), strides, 0, 0, indent, summarize);
    }
    if (dtype() != DType::Float32 && dtype() != DType::Int64 && dtype() != DType::Bool) {
      suffixes.push_back("dtype=" + std::string(dtype_name(dtype())));
    }
  }
  if (impl_->grad_fn) suffixes.push_back("grad_fn=<" + impl_->grad_fn->name + ">");
  else if (requires_grad()) suffixes.push_back("requires_grad=True");
  return with_suffixes(prefix + text, suffixes, indent);
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.str(); }

}  // namespace ferry
