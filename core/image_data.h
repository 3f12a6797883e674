// Image classification data from idx files (the MNIST format): Fashion-MNIST
// (`fmnist`, `fmnist:DIR`) and any other idx image set (`idx:IMAGES,LABELS`).
// Internal to core: LoadDataset (core/data.h) dispatches here, and the
// trainer sees only the Dataset interface.
//
// Layouts. Images are unsigned bytes: idx3 is N×H×W (grayscale, one
// channel); idx4 is N×H×W×C, channels last as in an image file or a numpy
// array, with C from 1 to 4. Labels are idx1 of unsigned bytes or of
// big-endian int32, each in [0, classes); the number of classes is the
// largest label (train or validation) + 1. Any file may be gzipped.
//
// Pure functions of their inputs (files aside); the dataset is immutable
// after loading, so concurrent reads are safe.
#ifndef STARLING_CORE_IMAGE_DATA_H_
#define STARLING_CORE_IMAGE_DATA_H_

#include <torch/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/data.h"

namespace starling {

// Whether `spec` names image data: fmnist, fmnist:DIR or idx:IMAGES,LABELS.
bool IsImageSpec(const std::string& spec);

// Images and their labels, as loaded.
struct ImageSet {
  torch::Tensor images;  // uint8 [N, C, H, W]
  torch::Tensor labels;  // int64 [N]
  std::string source;    // the files, for messages
};

// Reads an idx image file (idx3 or idx4, see above) and its idx1 label file.
// NotFound naming a missing file; InvalidArgument naming the file and what
// is wrong (not idx, wrong rank or type, images and labels that disagree in
// number, a negative label, more than 4 channels).
absl::StatusOr<ImageSet> LoadIdxImages(const std::string& images_path,
                                       const std::string& labels_path);

// The image data set `opts.spec` names, with `opts.val_spec` (if any) as its
// validation set. Errors as LoadDataset's, without the leading "--data=".
absl::StatusOr<std::unique_ptr<Dataset>> LoadImageDataset(
    const DataOptions& opts);

}  // namespace starling

#endif  // STARLING_CORE_IMAGE_DATA_H_
